"""Deployments: the upstream accounts and endpoints that serve one provider group's models.

A provider group (``openai``, ``anthropic``, ...) is served by one or more deployments, each with its
own address, credentials, weight, RPM/TPM ceilings, models and model names. The single-account form
(``[providers.X] base_url`` / ``api_key``, or the environment) is one deployment named after the
provider. Which deployment serves a call is gateway/routing.py's business; this module only says
what the deployments are, and refuses a configuration that cannot work, naming the deployment::

    [providers.openai]
    routing = "usage"                     # simple-shuffle (default) | least-busy | latency | usage
    sticky = true                         # keep a conversation on one deployment
    model_routing = { "gpt-4o" = "latency" }

    [[providers.openai.deployments]]
    name = "primary"
    api_key_env = "OPENAI_API_KEY"        # or api_key_file = "/run/secrets/openai", or api_key = "..."
    weight = 3
    rpm = 10000                           # the gateway sends it at most this many calls a minute
    tpm = 2000000

    [[providers.openai.deployments]]
    name = "azure-eu"
    kind = "azure"                        # Azure OpenAI: /openai/deployments/{name}/..., api-key header
    base_url = "https://my-resource.openai.azure.com"
    api_version = "2024-10-21"
    api_key_file = "/run/secrets/azure-eu"
    models = ["gpt-4o-mini"]              # only these models (default: every model of the group)
    endpoints = ["chat", "embeddings"]    # only these endpoints (default: every one)
    model_names = { "gpt-4o-mini" = "mini-eu" }   # this deployment's name for a model

Credentials are read when the gateway starts (a variable that is unset or a file that cannot be
read is an error naming the deployment) and never appear in a repr, a log line or an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from core.catalog import ConfigError
from core.types import Endpoint

if TYPE_CHECKING:
    from core.catalog import Catalog, Model

Strategy = Literal["simple-shuffle", "least-busy", "latency", "usage"]

# The kinds of deployment each wire protocol can reach: the protocol's own API, and the clouds that
# serve it under another URL shape and auth (adapters build both; docs/providers.md has the wire).
KINDS: dict[str, tuple[str, ...]] = {
    "openai": ("openai", "azure"),
    "anthropic": ("anthropic",),
    "gemini": ("gemini",),
}
NEEDS_BASE_URL = frozenset({"azure"})  # kinds with no default address: the resource is the operator's
NEEDS_API_VERSION = frozenset({"azure"})

PerMinute = Annotated[int, msgspec.Meta(ge=0)]
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"  # a deployment's name
is_name = re.compile(NAME).match


class DeploymentSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[[providers.X.deployments]]``: one upstream account or endpoint of a provider group."""

    name: Annotated[str, msgspec.Meta(pattern=NAME)]
    kind: str | None = None  # default: the group's own API (its wire protocol); openai: also "azure"
    base_url: str | None = None  # default: the catalog's address of the group (azure: required)
    api_key: str | None = None  # inline; prefer api_key_env or api_key_file
    api_key_env: str | None = None  # the environment variable holding the key
    api_key_file: str | None = None  # a file holding the key (surrounding whitespace ignored)
    api_version: str | None = None  # azure: the api-version query parameter, e.g. "2024-10-21"
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    rpm: PerMinute = 0  # calls per minute the gateway sends it (0: no ceiling)
    tpm: PerMinute = 0  # tokens per minute (a call's worst case, as the rate limits count it)
    models: list[str] = []  # the models it serves (default: all of the group's)
    endpoints: list[Endpoint] = []  # the gateway endpoints it serves (default: all)
    model_names: dict[str, str] = {}  # model -> its name at this deployment (azure: the deployment)
    connect_timeout: float | None = None  # default: the provider's
    read_timeout: float | None = None


class Deployment(msgspec.Struct, frozen=True):
    """One deployment, resolved: what an adapter needs to build a request, and what routing weighs.
    ``key`` names it in the gateway's state (its breaker, the shared state): ``prefix/name``, or the
    prefix alone for the single-account form (so its circuit keeps the provider's name)."""

    prefix: str
    base_url: str
    api_key: str
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    name: str = ""  # default: the provider's prefix (the single-account form)
    kind: str = ""  # "" is the group's own API
    weight: float = 1.0
    rpm: int = 0
    tpm: int = 0
    models: frozenset[str] | None = None  # canonical model ids it serves; None: every one
    endpoints: frozenset[str] | None = None  # the endpoints it serves; None: every one
    names: dict[str, str] = {}  # canonical model id -> upstream name here
    api_version: str = ""
    key: str = ""  # set from prefix and name

    def __post_init__(self) -> None:
        if not self.name:
            msgspec.structs.force_setattr(self, "name", self.prefix)
        key = self.prefix if self.name == self.prefix else f"{self.prefix}/{self.name}"
        msgspec.structs.force_setattr(self, "key", key)

    def __repr__(self) -> str:  # never the key
        return f"Deployment({self.prefix}/{self.name}, {self.kind or 'native'}, {self.base_url})"

    def serves(self, model: Model, endpoint: str = "chat") -> bool:
        return (self.models is None or (model.alias_of or model.id) in self.models) and (
            self.endpoints is None or endpoint in self.endpoints
        )

    def upstream_name(self, model: Model) -> str:
        """The model's name at this deployment (an Azure deployment's name, a renamed model)."""
        return self.names.get(model.alias_of or model.id, model.upstream) if self.names else model.upstream


def canonical(prefix: str, name: str, catalog: Catalog, where: str) -> str:
    """The canonical id of a model named in a deployment (with or without the group's prefix)."""
    model_id = name if "/" in name else f"{prefix}/{name}"
    try:
        model = catalog.resolve(model_id)
    except Exception:  # ModelNotFound: a config error here, at start
        raise ConfigError(f"{where}: unknown model '{name}' (GET /v1/models lists them)") from None
    if model.provider != prefix:
        raise ConfigError(
            f"{where}: the model '{name}' belongs to the group '{model.provider}', not '{prefix}'"
        )
    return model.alias_of or model.id


def check(prefix: str, protocol: str, items: list[DeploymentSettings], catalog: Catalog, source: str) -> None:
    """What can be refused without the environment: names, kinds, models, where credentials come from."""
    seen: set[str] = set()
    for item in items:
        where = f"{source}: providers.{prefix}.deployments '{item.name}'"
        if item.name in seen:
            raise ConfigError(f"{where}: the name is used twice in the group")
        seen.add(item.name)
        kind = item.kind or protocol
        if kind not in KINDS[protocol]:
            known = ", ".join(KINDS[protocol])
            raise ConfigError(f"{where}: unknown kind '{item.kind}' (known for {prefix}: {known})")
        sources = [s for s in (item.api_key, item.api_key_env, item.api_key_file) if s is not None]
        if not sources or not all(sources):
            raise ConfigError(f"{where}: no credentials (set api_key_env, api_key_file or api_key)")
        if len(sources) > 1:
            raise ConfigError(f"{where}: give one of api_key_env, api_key_file and api_key, not several")
        if kind in NEEDS_BASE_URL and not item.base_url:
            raise ConfigError(f"{where}: kind '{kind}' needs base_url (the resource's endpoint)")
        if kind in NEEDS_API_VERSION and not item.api_version:
            raise ConfigError(f"{where}: kind '{kind}' needs api_version (e.g. \"2024-10-21\")")
        for name in [*item.models, *item.model_names]:
            canonical(prefix, name, catalog, where)


def secret(item: DeploymentSettings, where: str) -> str:
    """The deployment's key, from where the settings say; an error naming the deployment (never the
    key) if it cannot be had."""
    if item.api_key_env is not None:
        value = os.environ.get(item.api_key_env, "").strip()
        if not value:
            raise ConfigError(
                f"{where}: the environment variable {item.api_key_env} (its api_key_env) is not set"
            )
        return value
    if item.api_key_file is not None:
        try:
            value = Path(item.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError(f"{where}: cannot read its api_key_file {item.api_key_file}: {why}") from None
        if not value:
            raise ConfigError(f"{where}: its api_key_file {item.api_key_file} is empty")
        return value
    return item.api_key or ""


def resolve(
    prefix: str,
    protocol: str,
    default_url: str,
    item: DeploymentSettings,
    catalog: Catalog,
    timeouts: tuple[float, float],
) -> Deployment:
    where = f"providers.{prefix}.deployments '{item.name}'"
    kind = item.kind or protocol
    models = frozenset(canonical(prefix, m, catalog, where) for m in item.models) if item.models else None
    names = {canonical(prefix, m, catalog, where): upstream for m, upstream in item.model_names.items()}
    return Deployment(
        prefix,
        (item.base_url or default_url).rstrip("/"),
        secret(item, where),
        item.connect_timeout if item.connect_timeout is not None else timeouts[0],
        item.read_timeout if item.read_timeout is not None else timeouts[1],
        name=item.name,
        kind="" if kind == protocol else kind,
        weight=item.weight,
        rpm=item.rpm,
        tpm=item.tpm,
        models=models,
        names=names,
        api_version=item.api_version or "",
        endpoints=frozenset(item.endpoints) if item.endpoints else None,
    )
