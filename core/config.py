"""Settings: one TOML file (``--config PATH`` or ``ROUTER_CONFIG``) decoded into msgspec structs.

Every table is optional; with no file at all the gateway runs on built-in defaults (SQLite under
``./data/``, the built-in catalog, provider keys from the environment). Unknown keys are errors that
name the key. Environment variables override the file for provider credentials and addresses:
``<PREFIX>_API_KEY`` (the catalog's ``api_key_env``) and ``ROUTER_<PREFIX>_BASE_URL``.

Example::

    [server]
    host = "0.0.0.0"
    port = 8080
    key_prefix = "sk-mr"

    [store]
    url = "postgresql://router@db/router"

    [providers.openai]
    base_url = "https://api.openai.com/v1"
    api_key = "sk-..."
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from core.catalog import Catalog, ConfigError
from core.deployments import Deployment, DeploymentSettings, Strategy, canonical, check, resolve
from core.destinations import Destinations
from core.inputs import key_of
from core.redact import DEFAULT_KEY_PREFIX


class ServerSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8080
    key_prefix: str = DEFAULT_KEY_PREFIX
    max_body_bytes: int = 8 * 1024 * 1024
    graceful_timeout: float = 30.0  # on SIGTERM: how long open streams may take to finish
    keep_alive_timeout: float = 75.0  # idle connections (and half-sent request heads) are closed after this
    # client connections open at once (0: what the descriptor limit allows, a client and an upstream
    # socket each) and idle ones (no request in flight; 0: as many as max_connections); over either,
    # the one idle longest is closed to make room, and with every connection busy a new one is
    # answered 503 (server/connections.py)
    max_connections: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_idle_connections: Annotated[int, msgspec.Meta(ge=0)] = 0
    auth_cache_seconds: float = 2.0
    # processes serving the one port (router serve); more than 1 needs a shared store (PostgreSQL), and
    # shared rate limits need [limits] redis_url (else each worker keeps its own buckets)
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    # browser origins that may call /v1/* (CORS), e.g. ["https://app.example.com"], or ["*"]; [] = none
    cors_origins: list[str] = []
    # the server layer over hypercorn (server/serve.py: bounded connections, httptools for HTTP/1.1, leaner
    # HTTP/2 steps), verified on the pinned hypercorn; false: stock hypercorn, whatever its version
    fast_path: bool = True


class StoreSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: str = "sqlite:///./data/router.db"
    # with several replicas (PostgreSQL), a reservation older than this is taken as left by a crash
    stale_reservation_seconds: float = 3600.0
    # PostgreSQL: each replica heartbeats every heartbeat_seconds; the holds of one whose heartbeat is
    # older than lease_grace_seconds are released by the others (billing/leases.py)
    heartbeat_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    lease_grace_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # settlements the store could not take for journal_after_seconds go to this file (one JSON line
    # each, fsync'd) until it can (billing/journal.py); "" = beside the SQLite file
    # (<file>.settlements.jsonl), or ./data/settlements.jsonl for PostgreSQL
    journal: str = ""
    journal_after_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # a reply's last byte waits up to this for its call's settlement to be durable, so a call the caller
    # saw complete is charged even if the process dies the next instant; 0: replies do not wait (a hard
    # kill may then lose the charges of the calls settled in the last ~30 ms)
    reply_wait_seconds: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # every this many seconds, the usage so far of each stream in flight is kept in the store: a stream
    # cut by a crash is charged for what it generated up to then (at the next start on SQLite, by the
    # replica that releases the dead one's holds on PostgreSQL); 0: not kept (such a stream costs nothing).
    # A checkpoint counts the tokens the stream added (and its prompt's, with its first) and writes the
    # counts, never the text (docs/operations.md, "Faults")
    checkpoint_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0

    def journal_path(self) -> Path:
        if self.journal:
            return Path(self.journal)
        if self.url.startswith("sqlite://"):
            rest = self.url[len("sqlite://") :]
            rest = rest[1:] if rest.startswith("/") else rest  # as billing.sqlite.sqlite_path reads it
            if rest and rest != ":memory:":
                return Path(rest + ".settlements.jsonl")
        return Path("data/settlements.jsonl")


class ProviderSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[providers.X]``: one provider group. ``base_url`` / ``api_key`` are its single account (one
    deployment named after the group); ``deployments`` lists several instead (core/deployments.py)."""

    base_url: str | None = None
    api_key: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    deployments: list[DeploymentSettings] = []
    routing: Strategy = "simple-shuffle"  # how a call picks among the deployments (gateway/routing.py)
    model_routing: dict[str, Strategy] = {}  # a model's own strategy (keys: model names of the group)
    sticky: bool = False  # keep a conversation on one deployment while it is not cooling down


class RoutingSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[routing]``: how deployments are weighed and rested (gateway/routing.py). The state they share
    (calls in flight, RPM/TPM, cooldowns, latency) lives in ``[limits] redis_url`` when it is set."""

    cooldown: Annotated[float, msgspec.Meta(ge=0)] = 5.0  # seconds a deployment rests after a 429 that
    # gave no Retry-After (a Retry-After is honoured, up to max_cooldown)
    max_cooldown: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    exploration: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1  # latency: share of calls sent at random
    latency_weight: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.3  # a new sample's weight in the average
    sticky_messages: Annotated[int, msgspec.Meta(ge=1)] = 2  # the first messages that name a conversation
    redis_prefix: str = "router:dep"


class ReliabilitySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_retries: int = 2  # per upstream, before the first byte has gone to the caller
    backoff_base: float = 0.25  # seconds; doubled per attempt, with jitter
    backoff_max: float = 4.0
    deadline: float = 120.0  # seconds a call may spend on retries and fallbacks before giving up
    first_byte_timeout: float = 120.0  # seconds to wait for the upstream's response headers
    stream_keepalive: float = 5.0  # seconds between ": keep-alive" comments while a stream waits
    breaker_threshold: int = 5  # failed calls in a row (each counted once) that open a deployment's circuit
    breaker_cooldown: float = 30.0
    body_timeout: float = 30.0  # seconds to receive a request body (slow clients get 408)


class CatalogSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str | None = None


PerMinute = Annotated[int, msgspec.Meta(ge=0)]
InFlightLimit = Annotated[int, msgspec.Meta(ge=0)]


class GroupLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[limits.groups.<name>]``: one group's limits (and its keys'); unset ones inherit ``[limits]``."""

    key_rpm: PerMinute | None = None
    key_tpm: PerMinute | None = None
    group_rpm: PerMinute | None = None
    group_tpm: PerMinute | None = None
    key_concurrent: InFlightLimit | None = None
    group_concurrent: InFlightLimit | None = None


class LimitsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Rate limits (gateway/ratelimit.py): requests and tokens per minute, per key and per group, and calls
    in flight (gateway/concurrency.py); 0 = none."""

    key_rpm: PerMinute = 0
    key_tpm: PerMinute = 0
    group_rpm: PerMinute = 0
    group_tpm: PerMinute = 0
    # calls in flight at once (gateway/concurrency.py): a key's, a group's; batch lines and background
    # responses do not count
    key_concurrent: InFlightLimit = 0
    group_concurrent: InFlightLimit = 0
    # with no group_concurrent: no group holds more than 3/4 of this in one process, and past that a group
    # holding its share (3/4 over the groups active now) is refused 429 (gateway/fairshare.py); 0: never
    fair_share_calls: Annotated[int, msgspec.Meta(ge=0)] = 256
    redis_url: str = ""  # empty: counted in this process; redis://host:port/db: shared by every replica
    redis_prefix: str = "router:rl"
    redis_timeout: float = 0.25  # seconds per check before it counts as a Redis failure
    fail_open: bool = True  # Redis unreachable: admit calls unchecked (and log) rather than refuse them
    headers: bool = True  # x-ratelimit-* on every admitted answer, as OpenAI sends them; false: on 429s only
    groups: dict[str, GroupLimits] = {}


class ObservabilitySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"] = "INFO"
    log_format: Literal["json", "text", "none"] = "json"  # none: leave the router loggers to the host app
    access_log: bool = True  # one line per HTTP request on the `router.access` logger
    access_log_file: str = ""  # write the access lines to this file (appended) instead of stderr
    metrics: bool = True  # serve GET /metrics


class HealthSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # providers that must accept a TCP connection for /readyz
    upstreams: Literal["all", "any", "none"] = "all"
    timeout: float = 1.0  # seconds per probe (store query, TCP connect)
    cache_seconds: float = 5.0


# [console] listen: host:port (an IPv6 host in brackets) or unix:/path, as hypercorn binds them
LISTEN = re.compile(r"unix:.+|(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):([1-9][0-9]{0,4})")

MIN_ADMIN_TOKEN = 24  # a valid admin token always opens the admin API: it must be too long to guess


class ConsoleSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[console]``: the management console at /console (console/). The admin logs in with the password
    set by ``router console set-password`` (stored scrypt-hashed) or with ``admin_token``, which also
    opens the admin JSON API (``Authorization: Bearer ...``; else ``$ROUTER_CONSOLE_TOKEN``)."""

    enabled: bool = True
    # empty, or at least 24 characters (a valid token always opens the API, so it must not be guessable)
    admin_token: str = ""
    password_hash: str = ""  # an scrypt hash as `router console hash-password` prints it; else the store's
    session_secret: str = ""  # signs session cookies; empty: a random one kept in the store
    session_seconds: Annotated[float, msgspec.Meta(gt=0)] = 8 * 3600.0
    secure_cookies: bool = False  # set the cookies' Secure flag (the console is served over HTTPS)
    login_window_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    login_attempts_per_ip: Annotated[int, msgspec.Meta(ge=1)] = 5  # failed logins per window, per client IP
    login_attempts_global: Annotated[int, msgspec.Meta(ge=1)] = 50  # failed logins per window, all IPs
    csv_max_rows: Annotated[int, msgspec.Meta(ge=1)] = 1_000_000
    # single sign-on through OpenID Connect (console/sso.py): the issuer's URL (its discovery document
    # is <issuer>/.well-known/openid-configuration), the console's client there, and the claim of the ID
    # token that names the operator account (the account must exist: roles stay the console's)
    oidc_issuer: str = ""
    oidc_client_id: str = ""
    oidc_client_secret: str = ""  # else $ROUTER_OIDC_CLIENT_SECRET
    oidc_username_claim: str = "preferred_username"
    oidc_redirect_uri: str = ""  # empty: <the console's address, as the browser asked>/sso/callback
    # the console and the admin API on a listener of their own, apart from /v1: "127.0.0.1:8081", or
    # "unix:/run/router/console.sock" (only the gateway's user may connect); the main listener then
    # answers /console with 404. Empty: /console beside /v1 (server/serve.py serves the second listener)
    listen: str = ""


class JobsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[jobs]``: the Batch API (``/v1/files``, ``/v1/batches``) and its runner (jobs/)."""

    data_dir: str = ""  # SQLite store: where files live; empty = a ``files`` directory beside the database
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1)] = 100 * 1024 * 1024
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 50_000  # requests in one batch input file
    concurrency: Annotated[int, msgspec.Meta(ge=1)] = 8  # lines of one job in flight at once
    max_jobs: Annotated[int, msgspec.Meta(ge=1)] = 4  # jobs one gateway process runs at once
    poll_interval: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # seconds between looks for work
    lease_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0  # one replica's hold on a job, renewed
    line_timeout: Annotated[float, msgspec.Meta(gt=0)] = 900.0  # seconds one line may take
    stop_grace: Annotated[float, msgspec.Meta(ge=0)] = 10.0  # on shutdown: seconds lines in flight may finish
    runner: bool = True  # false: this process serves the endpoints but runs no jobs


class AlertsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[alerts]``: webhooks on thresholds (billing/alerts.py, gateway/alerts.py): the checks, and the
    deliveries from the durable outbox (retried with exponential backoff)."""

    enabled: bool = True  # false: this process neither checks thresholds nor delivers
    check_interval: Annotated[float, msgspec.Meta(gt=0)] = 30.0  # seconds between threshold checks
    deliver_interval: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # seconds between looks at the outbox
    backoff_base: Annotated[float, msgspec.Meta(gt=0)] = 5.0  # the first retry's delay; doubled per attempt
    backoff_max: Annotated[float, msgspec.Meta(gt=0)] = 3600.0
    max_attempts: Annotated[int, msgspec.Meta(ge=1)] = 15  # then the delivery is marked failed
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # seconds a receiver has to answer
    lease_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0  # a replica's hold on the events it delivers
    batch: Annotated[int, msgspec.Meta(ge=1)] = 20  # events claimed per look
    # webhooks go to public addresses only; receivers inside: their networks and host names, e.g.
    # ["10.0.0.0/8", "receiver.internal"] (core/destinations.py; cloud metadata services never)
    allow_destinations: list[str] = []

    def destinations(self) -> Destinations:
        return Destinations.parse(self.allow_destinations)


class BillingSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[billing]``: what a caller is told of a call's price, and the calendar budgets follow."""

    # ``usage.cost`` (credits, exact) in every answer and stream usage, and ``x-request-cost`` on
    # non-stream answers (docs/api.md, "Cost in the answer")
    cost_in_answer: bool = True
    # the time zone of calendar budget windows (a day, a week, a month): an IANA name
    timezone: str = "UTC"


class ResponsesSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[responses]``: the stored responses of ``/v1/responses`` (gateway/response_store.py)."""

    retention_days: Annotated[float, msgspec.Meta(gt=0)] = 30.0  # a stored response is purged after this
    purge_interval: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # seconds between purges of expired ones
    max_stored_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024  # one response's input + output
    max_chain: Annotated[int, msgspec.Meta(ge=1)] = 1000  # responses one previous_response_id chain may hold
    background_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 16  # background responses one process runs
    # the key (64 hex digits, or base64 of 32 bytes) that seals provider state into reasoning items for
    # callers that keep nothing (gateway/sealed.py); or $ROUTER_SEAL_KEY; empty: one made once, kept in the store
    seal_key: str = ""


class ModelNames(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[models]``: names callers send, mapped to catalog models (``map``: for every group;
    ``groups.<name>``: for one group, which wins). A name may hide a catalog id: Claude Code's
    ``claude-haiku-4-5`` sent to ``google/gemini-2.5-flash``, say."""

    map: dict[str, str] = {}
    groups: dict[str, dict[str, str]] = {}


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    providers: dict[str, ProviderSettings] = {}
    routing: RoutingSettings = msgspec.field(default_factory=RoutingSettings)
    catalog: CatalogSettings = msgspec.field(default_factory=CatalogSettings)
    reliability: ReliabilitySettings = msgspec.field(default_factory=ReliabilitySettings)
    limits: LimitsSettings = msgspec.field(default_factory=LimitsSettings)
    observability: ObservabilitySettings = msgspec.field(default_factory=ObservabilitySettings)
    health: HealthSettings = msgspec.field(default_factory=HealthSettings)
    jobs: JobsSettings = msgspec.field(default_factory=JobsSettings)
    console: ConsoleSettings = msgspec.field(default_factory=ConsoleSettings)
    alerts: AlertsSettings = msgspec.field(default_factory=AlertsSettings)
    billing: BillingSettings = msgspec.field(default_factory=BillingSettings)
    responses: ResponsesSettings = msgspec.field(default_factory=ResponsesSettings)
    models: ModelNames = msgspec.field(default_factory=ModelNames)

    def load_catalog(self) -> Catalog:
        catalog = Catalog.load(Path(self.catalog.path) if self.catalog.path else None, self.server.key_prefix)
        return (
            catalog.named(self.models.map, self.models.groups)
            if self.models.map or self.models.groups
            else catalog
        )

    def deployments(self, prefix: str, catalog: Catalog) -> list[Deployment]:
        """One provider group's deployments, credentials read (a ConfigError names a deployment whose
        key cannot be had). The single-account form: file, then environment, then catalog default."""
        spec = catalog.providers[prefix]
        own = self.providers.get(prefix, ProviderSettings())
        timeouts = (own.connect_timeout, own.read_timeout)
        if own.deployments:
            return [
                resolve(prefix, spec.protocol, spec.base_url, d, catalog, timeouts) for d in own.deployments
            ]
        env_url = os.environ.get(f"ROUTER_{prefix.upper()}_BASE_URL")
        base_url = (env_url or own.base_url or spec.base_url).rstrip("/")
        api_key = own.api_key or os.environ.get(spec.api_key_env, "")
        return [Deployment(prefix, base_url, api_key, *timeouts)]

    def provider(self, prefix: str, catalog: Catalog) -> Deployment:
        """The group's first deployment (its only one in the single-account form)."""
        return self.deployments(prefix, catalog)[0]


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read settings from ``path``, else ``$ROUTER_CONFIG``, else built-in defaults."""
    if path is None:
        path = os.environ.get("ROUTER_CONFIG") or None
    if path is None:
        return Settings()
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_settings(raw, str(file))


def parse_settings(raw: dict, source: str = "config") -> Settings:
    try:
        settings = msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if 0 < len(settings.console.admin_token) < MIN_ADMIN_TOKEN:
        raise ConfigError(
            f"{source}: console.admin_token must be at least {MIN_ADMIN_TOKEN} characters "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if settings.console.oidc_issuer and not settings.console.oidc_client_id:
        raise ConfigError(
            f"{source}: console.oidc_client_id: single sign-on needs the console's client id at the issuer"
        )
    listen = LISTEN.fullmatch(settings.console.listen)
    if settings.console.listen and not (listen and int(listen[2] or 1) < 65536):
        raise ConfigError(
            f"{source}: console.listen: {settings.console.listen!r} is neither HOST:PORT "
            "(e.g. 127.0.0.1:8081, [::1]:8081) nor unix:PATH"
        )
    try:
        ZoneInfo(settings.billing.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{source}: billing.timezone: unknown time zone {settings.billing.timezone!r} "
            "(an IANA name such as UTC or Europe/Paris)"
        ) from None
    try:
        settings.alerts.destinations()
    except ValueError as exc:
        raise ConfigError(f"{source}: alerts.allow_destinations: {exc}") from None
    if settings.responses.seal_key:
        try:
            key_of(settings.responses.seal_key)
        except ValueError as exc:
            raise ConfigError(f"{source}: responses.seal_key: {exc}") from None
    catalog = settings.load_catalog()
    for prefix, own in settings.providers.items():
        if prefix not in catalog.providers:
            known = ", ".join(sorted(catalog.providers))
            raise ConfigError(f"{source}: unknown provider `providers.{prefix}` (known: {known})")
        if own.deployments and (own.base_url or own.api_key):
            raise ConfigError(
                f"{source}: providers.{prefix}: base_url and api_key belong to each of its "
                "deployments when it lists deployments"
            )
        check(prefix, catalog.providers[prefix].protocol, own.deployments, catalog, source)
        for name in own.model_routing:
            canonical(prefix, name, catalog, f"{source}: providers.{prefix}.model_routing")
    return settings


__all__ = ["ConfigError", "Deployment", "Settings", "load_settings", "parse_settings"]
