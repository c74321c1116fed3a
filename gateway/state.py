"""The gateway's shared state: settings, catalog, store, transport, adapters, authenticator.

One instance per app. It starts on the app's lifespan, or lazily on the first request when the app is
mounted inside another application whose lifespan does not reach ours.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from adapters import Adapter, adapter_for
from adapters.transport import ObservedTransport
from billing import tokens
from billing.alerts import AlertBook
from billing.backends import open_store
from billing.journal import Journal, store_tag
from billing.ledger import ledger_for
from billing.store import Store
from core.catalog import ConfigError
from core.config import Settings, load_settings
from core.deadlines import Deadlines
from core.deployments import Deployment
from gateway import backends
from gateway.alerts import Checker, Deliverer, budget_source
from gateway.attempts import Attempts
from gateway.auth import LAST_USED_SECONDS, Authenticator
from gateway.concurrency import InFlight
from gateway.dispatch import dispatcher_for
from gateway.fairshare import FairShare
from gateway.periodic import Periodic
from gateway.ratelimit import RateLimiter
from gateway.refusals import Refusals
from gateway.reliability import Breakers
from gateway.response_store import ResponseStore
from gateway.sealed import Sealer, key_of
from gateway.tracing import Tracing
from gateway.tracing import from_environment as tracing_from_environment

# what a reload keeps as the process started with (they take effect at the next restart)
RESTART = ("server", "store", "jobs", "console", "observability", "alerts", "billing", "responses", "health")


class Service(Protocol):
    """Something that runs beside the calls and starts and stops with the gateway (the batch runner,
    set by the HTTP layer: ``router.app``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class BatchView(Protocol):
    """What the console reads of a batch (``jobs.store.BatchRow`` has these and more)."""

    @property
    def id(self) -> str: ...

    @property
    def group_id(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def total(self) -> int: ...


class LineView(Protocol):
    """A failed line of a batch (``jobs.store.LineState``)."""

    @property
    def line_no(self) -> int: ...

    @property
    def result(self) -> str | None: ...


class BatchBook(Protocol):
    """The batches, as the console shows them across groups (the batch runner, set by the HTTP layer:
    ``router.app``)."""

    async def browse(
        self, group_id: int | None, status: str | None, before: str | None, limit: int
    ) -> Sequence[BatchView]: ...

    async def batch(self, batch_id: str) -> BatchView | None: ...

    async def failed_lines(self, batch_id: str, limit: int) -> Sequence[LineView]: ...

    async def cancel(self, batch: BatchView) -> BatchView | None: ...


class Backgrounds(Protocol):
    """The runner of background responses (jobs/background.py through the batch runner, set by the
    HTTP layer: ``router.app``), as the Responses endpoints tell it of a change."""

    def poke_background(self) -> None: ...

    def cancel_background(self, response_id: str) -> None: ...


class Gateway:
    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.catalog = settings.load_catalog()
        self.store = store or open_store(settings.store.url)
        self.transport = ObservedTransport()  # the shared transport, counting failed upstream attempts
        # SQLite: one gateway per file, so admission is held in this process's memory (no store round
        # trip per call); PostgreSQL: reservations are atomic updates in the store, shared by replicas
        st = settings.store
        self.ledger = ledger_for(
            self.store, st.journal_after_seconds, st.reply_wait_seconds, st.checkpoint_seconds
        )
        self.limits = RateLimiter(settings.limits, backends.rate_limits(settings.limits))
        # calls in flight per key and group (gateway/concurrency.py), on the rate limits' Redis connection
        self.in_flight = InFlight(settings.limits, backends.in_flight(settings.limits, self.limits.backend))
        self.fair = FairShare(settings.limits)  # each group's share of this process's calls in flight
        self.refusals = Refusals()  # which refused calls leave a usage record (a flood: a sample)
        # the console's logins, counted before they are checked, in Redis or the store (gateway/attempts.py)
        lim = settings.limits
        self.attempts = Attempts(self.store.database, lim.redis_url, lim.redis_prefix, lim.redis_timeout)
        self.deadlines = Deadlines()  # the call path's timeouts (body, first byte)
        self.auth = Authenticator(self.store, settings.server.key_prefix, settings.server.auth_cache_seconds)
        # the keys' last-used times, written in one batch a minute (gateway/auth.py: LastUsed)
        self.background: list[Periodic] = [
            Periodic("last-used", LAST_USED_SECONDS, self.auth.last_used.flush)
        ]
        if st.checkpoint_seconds:  # the usage so far of the streams in flight (billing/progress.py)
            self.background.append(
                Periodic(
                    "stream-checkpoints",
                    self.ledger.progress.tick_every,
                    self.ledger.progress.tick,
                    final=False,
                )
            )
        # alerts: threshold checks queue events in the outbox, deliveries send them (gateway/alerts.py)
        self.alerts = AlertBook(self.store.database)
        self.alert_checker = Checker(self.store, self.alerts)
        self.alert_checker.budgets = budget_source(self.store)  # 50 / 80 / 100 % of every budget's window
        self.alert_deliverer = Deliverer(self.alerts, settings.alerts)
        if settings.alerts.enabled:
            a = settings.alerts
            self.background += [
                Periodic("alert-checks", a.check_interval, self.alert_checker.check, final=False),
                Periodic("alert-deliveries", a.deliver_interval, self.alert_deliverer.deliver, final=False),
            ]
        self.adapters: dict[str, Adapter] = {}  # provider prefix → its adapter (every provider has one)
        self.deployments: dict[str, list[Deployment]] = {}  # provider prefix → its deployments
        for prefix, spec in self.catalog.providers.items():
            self.deployments[prefix] = settings.deployments(prefix, self.catalog)
            self.adapters[prefix] = adapter_for(prefix, spec)
        self.providers = {prefix: deps[0] for prefix, deps in self.deployments.items()}  # each group's first
        # which deployment serves a call
        self.dispatcher = dispatcher_for(settings, self.catalog, self.deployments)
        rel = settings.reliability
        # one circuit per deployment (its key: the provider's prefix in the single-account form); a probe
        # that nobody reports on (a bug) frees it after the longest a call can take
        self.breakers = Breakers(
            rel.breaker_threshold,
            rel.breaker_cooldown,
            rel.deadline + rel.first_byte_timeout,
            [d.key for deps in self.deployments.values() for d in deps],
        )
        self.responses = ResponseStore(self.store.database)  # the stored responses of /v1/responses
        # traces of calls: None unless OTEL_* configure them
        self.tracing: Tracing | None = tracing_from_environment()
        # seals provider state into reasoning items (gateway/sealed.py), at start
        self.sealer: Sealer | None = None
        self.jobs: Service | None = None  # the Batch API's runner (jobs/), set by create_app
        self.batches: BatchBook | None = None  # the same runner, as the console reads it
        self.backgrounds: Backgrounds | None = None  # the same runner, running background responses
        self.config_path: str | None = None  # the file the settings came from: what a reload re-reads
        self._retired: list[
            Any
        ] = []  # routers a reload replaced: closed at stop (their calls may still hold leases)
        self.started = False
        self._warming: asyncio.Future[Any] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if not self.started:
                await self.store.open()
                await self.store.serve(self.settings.store)
                store = self.settings.store
                await self.ledger.start(Journal(store.journal_path(), store_tag(store.url)))
                self.sealer = Sealer(await self._seal_key())
                await self.transport.start()
                if self.jobs is not None:
                    await self.jobs.start()
                if self.settings.alerts.enabled:
                    await self.alerts.ready()  # the alerts' tables, migrated now rather than in a first round
                for task in self.background:
                    task.start()
                if store.checkpoint_seconds:  # the tokenizer the checkpoints count with, loaded now on a
                    # worker thread (0.2 s of parsing): at a first checkpoint under load it would hold the loop
                    self._warming = asyncio.get_running_loop().run_in_executor(None, tokens.encoding)
                self.started = True

    async def _seal_key(self) -> bytes:
        """``[responses] seal_key``, else ``$ROUTER_SEAL_KEY``, else the one kept in the store (made by the
        first replica to start)."""
        given = self.settings.responses.seal_key or os.environ.get("ROUTER_SEAL_KEY", "")
        if given:
            return key_of(given)
        return key_of(await self.responses.setting("seal_key", secrets.token_hex(32)))

    def reload(self, settings: Settings) -> list[str]:
        """Apply ``settings`` to the calls that start from now on (calls in flight finish on what they
        started with: their model, prices and deployment): providers and deployments (their keys read
        again), catalog and prices, model names, routing, reliability, limits. Built whole before
        anything changes: a ConfigError (a key that cannot be read, an unknown model, a Redis address
        that changed) leaves everything as it was. Returns the sections that changed but take effect
        at the next restart ([server], [store], [jobs], ...)."""
        old = self.settings
        redis = ("redis_url", "redis_prefix", "redis_timeout", "fail_open")
        if any(getattr(old.limits, name) != getattr(settings.limits, name) for name in redis):
            raise ConfigError(
                "limits: redis_url, redis_prefix, redis_timeout and fail_open change at a restart, "
                "not a reload"
            )
        catalog = settings.load_catalog()
        deployments = {prefix: settings.deployments(prefix, catalog) for prefix in catalog.providers}
        adapters = {prefix: adapter_for(prefix, spec) for prefix, spec in catalog.providers.items()}
        dispatcher = dispatcher_for(settings, catalog, deployments)
        # the backends kept (a Redis address changes at a restart), or built if limits are set anew
        limits = RateLimiter(settings.limits, self.limits.backend or backends.rate_limits(settings.limits))
        in_flight = InFlight(
            settings.limits, self.in_flight.backend or backends.in_flight(settings.limits, limits.backend)
        )
        kept = {name: getattr(old, name) for name in RESTART if getattr(old, name) != getattr(settings, name)}
        applied = msgspec.structs.replace(settings, **{name: getattr(old, name) for name in RESTART})
        # every part is built: now the swap, with no await in between
        self._retired.append(self.dispatcher)
        self.settings, self.catalog, self.deployments, self.adapters = applied, catalog, deployments, adapters
        self.providers = {prefix: deps[0] for prefix, deps in deployments.items()}
        self.dispatcher, self.limits, self.in_flight = dispatcher, limits, in_flight
        self.fair.configure(applied.limits)
        for deps in deployments.values():
            for deployment in deps:
                self.breakers[deployment.key]  # (a new deployment's breaker)
        return sorted(kept)

    def reload_file(self) -> list[str]:
        """:meth:`reload` from the file the settings came from (``config_path``, else $ROUTER_CONFIG)."""
        return self.reload(load_settings(self.config_path))

    async def stop(self) -> None:
        async with self._lock:
            if self.started:
                if self.jobs is not None:
                    await self.jobs.stop()  # first: lines in flight still use the transport and the ledger
                for task in self.background:
                    await task.stop()
                await self.alert_deliverer.close()
                await self.transport.close()
                await self.in_flight.close()  # (first: it may share the rate limits' connection)
                await self.limits.close()
                await self.attempts.close()
                await self.dispatcher.close()
                for retired in self._retired:
                    await retired.close()
                while self.ledger.pending:  # every call's settlement durable (or journaled) before the
                    await self.ledger.drain()  # store closes
                await self.ledger.close()
                await self.store.close()
                if self.tracing is not None:
                    await self.tracing.close()  # (the spans of the last settlements exported)
                self.started = False
