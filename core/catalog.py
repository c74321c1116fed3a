"""The model catalog: which model ids exist, who serves them, at what price, with which capabilities.

The catalog is data (``catalog.toml`` beside this file, optionally merged with an operator's file).
Lookups are O(1) on a dict built once: every canonical id, every alias, and every id written with a
prefix alias (``claude/...`` for ``anthropic/...``) map to one frozen :class:`Model`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal, get_args

import msgspec

from core.errors import InvalidRequest, ModelNotFound
from core.money import NANO
from core.redact import DEFAULT_KEY_PREFIX, redact_keys
from core.types import Endpoint

BUILTIN = Path(__file__).with_name("catalog.toml")
ENDPOINT_PATHS = {
    "chat": "chat/completions",
    "responses": "responses",
    "messages": "messages",
    "embeddings": "embeddings",
    "images": "images/generations",
}


class ConfigError(Exception):
    """A configuration or catalog file is wrong; the message names the file and the bad key."""


# The wire protocols an upstream may speak; adapters.ADAPTERS has exactly one adapter for each.
WireProtocol = Literal["openai", "anthropic", "gemini"]
PROTOCOLS: tuple[str, ...] = get_args(WireProtocol)


class PriceSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    input: str = "0"
    output: str = "0"
    cached_input: str | None = None
    cache_write: str | None = None
    # a cache write kept for an hour (Anthropic's ttl "1h"); default: cache_write
    cache_write_1h: str | None = None
    image: str | None = None  # credits per generated image (Imagen); token-priced models leave it unset
    image_input: str | None = None  # per 1M tokens of input images (gpt-image edits); default: input


class EmbeddingSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What an embedding model takes (docs/providers.md, Embeddings): its vector's size, the sizes a
    caller may ask for (``dimensions``; 0: none but the default), the most inputs in one upstream
    request, whether token arrays are accepted."""

    dimensions: int
    min_dimensions: int = 0
    max_dimensions: int = 0
    max_inputs: int = 2048
    token_arrays: bool = False


class ImageSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What an image model takes on /v1/images (docs/providers.md, Images): the sizes it draws
    (``auto`` where the provider picks), the most images per request, whether it edits images."""

    sizes: list[str]
    max_n: int = 1
    edits: bool = False


class ProviderSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    protocol: WireProtocol
    base_url: str
    api_key_env: str
    owned_by: str
    aliases: list[str] = []
    stream_usage: Literal["ask", "always"] = "ask"
    drop_fields: list[str] = []
    rename_fields: dict[str, str] = {}
    finish_reasons: dict[str, str] = {}
    reasoning_field: str | None = None
    reasoning_cap_field: str | None = None  # where a reasoning model wants max_tokens moved
    reasoning_drop_fields: list[str] = []  # sampling fields a reasoning model refuses: not sent to one
    tool_call_ids: Literal["any", "alnum9"] = "any"  # alnum9: exactly 9 of [a-zA-Z0-9] (Mistral)
    responses_api: bool = False  # the upstream serves POST /responses itself: /v1/responses passes through
    custom_tools: bool = False  # the upstream takes OpenAI's custom tools ("type": "custom", free-form input)


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    alias_of: str | None = None
    upstream: str | None = None
    kind: Literal["chat", "reasoning", "search", "code", "image-generation", "image-preview", "embedding"] = (
        "chat"
    )
    endpoints: list[Endpoint] = msgspec.field(default_factory=lambda: ["chat", "responses"])
    image_input: bool = False
    tools: bool = True  # function tools (OpenAI's ``tools``) are taken; false: 400 tools_unsupported
    reasoning: bool = False
    context: int = 0
    max_output: int = 4096
    default_max_tokens: int | None = None
    price: PriceSpec = PriceSpec()
    created: int = 0
    shutdown_date: str | None = None  # announced end of life (YYYY-MM-DD)
    fallbacks: list[str] = []
    embedding: EmbeddingSpec | None = None
    image: ImageSpec | None = None


class CatalogFile(msgspec.Struct, forbid_unknown_fields=True):
    providers: dict[str, ProviderSpec] = {}
    models: list[ModelSpec] = []


@dataclass(frozen=True, slots=True)
class Prices:
    """Nano-credits per 1M tokens of each kind."""

    input: int
    output: int
    cached_input: int
    cache_write: int
    image: int = 0  # per generated image
    cache_write_1h: int = 0  # of the cache writes, those kept for an hour (0: at cache_write)
    image_input: int = 0  # per 1M tokens of input images


@dataclass(frozen=True, slots=True)
class Model:
    id: str  # canonical id; an alias keeps its own id here and names its target in alias_of
    provider: str  # canonical provider prefix
    upstream: str  # the model name sent to the provider
    kind: str
    endpoints: frozenset[str]
    image_input: bool
    reasoning: bool
    context: int
    max_output: int
    default_max_tokens: int | None
    prices: Prices
    created: int
    alias_of: str | None
    fallbacks: tuple[str, ...]
    shutdown_date: str | None = None
    tools: bool = True
    embedding: EmbeddingSpec | None = None
    image: ImageSpec | None = None


def _nano(value: str | None, where: str, default: int) -> int:
    if value is None:
        return default
    try:
        amount = Decimal(value) * NANO
    except InvalidOperation:
        raise ConfigError(f"{where}: price {value!r} is not a decimal number") from None
    if amount != amount.to_integral_value() or amount < 0:
        raise ConfigError(f"{where}: price {value!r} has more than 9 decimals or is negative")
    return int(amount)


def _decode(path: Path) -> CatalogFile:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        return msgspec.convert(raw, CatalogFile)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def not_found(model_id: str, hint: str = "") -> ModelNotFound:
    """OpenAI's 404 for a model that does not exist, or that the key may not use."""
    return ModelNotFound(
        f"The model `{model_id}` does not exist or you do not have access to it.{hint}", param="model"
    )


class Catalog:
    def __init__(
        self,
        providers: dict[str, ProviderSpec],
        models: list[ModelSpec],
        source: str = "catalog",
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ):
        self.providers = providers
        self.key_prefix = key_prefix  # a key sent as the model is not echoed in the 404 (core/redact.py)
        self.prefix_alias: dict[str, str] = {}
        for name, spec in providers.items():
            self.prefix_alias[name] = name
            for alias in spec.aliases:
                self.prefix_alias[alias] = name
        specs = {m.id: m for m in models}
        self.models: dict[str, Model] = {}
        for model_spec in models:
            self.models[model_spec.id] = self._build(model_spec, specs, source)
        self._lookup: dict[str, Model] = {}
        bare: dict[str, list[str]] = {}
        for model_id, model in self.models.items():
            prefix, name = model_id.split("/", 1)
            for alias, canonical in self.prefix_alias.items():
                if canonical == prefix:
                    self._lookup[f"{alias}/{name}"] = model
            bare.setdefault(name, []).append(model_id)
        # a bare id (``claude-opus-4-8``, as coding agents send them) names the one model of that name
        self._ambiguous = {name: ids for name, ids in bare.items() if len(ids) > 1}
        for name, ids in bare.items():
            if len(ids) == 1:
                self._lookup.setdefault(name, self.models[ids[0]])
        self._names: dict[str, Model] = {}  # the operator's names for every group (``[models] map``)
        self._group_names: dict[str, dict[str, Model]] = {}  # and for one group (``[models.groups.<name>]``)

    def _build(self, spec: ModelSpec, specs: dict[str, ModelSpec], source: str) -> Model:
        where = f"{source}: model {spec.id!r}"
        if spec.id.count("/") != 1 or spec.id != spec.id.lower():
            raise ConfigError(f"{where}: ids are '<provider>/<model_name>', one slash, lower-case")
        prefix = spec.id.split("/", 1)[0]
        if prefix not in self.providers:
            raise ConfigError(f"{where}: unknown provider {prefix!r}")
        target = spec
        if spec.alias_of is not None:
            if spec.alias_of not in specs:
                raise ConfigError(f"{where}: alias_of {spec.alias_of!r} is not in the catalog")
            target = specs[spec.alias_of]
            if target.alias_of is not None:
                raise ConfigError(f"{where}: alias_of must name a model, not another alias")
        p = target.price
        inp = _nano(p.input, where, 0)
        upstream = target.upstream or target.id.split("/", 1)[1]
        return Model(
            id=spec.id,
            provider=prefix,
            upstream=upstream,
            kind=target.kind,
            # a model that chats serves Anthropic's Messages API too (gateway/messages_codec.py)
            endpoints=frozenset(target.endpoints) | ({"messages"} if "chat" in target.endpoints else set()),
            image_input=target.image_input,
            reasoning=target.reasoning,
            context=target.context,
            max_output=target.max_output,
            default_max_tokens=target.default_max_tokens,
            prices=Prices(
                input=inp,
                output=_nano(p.output, where, 0),
                cached_input=_nano(p.cached_input, where, inp),
                cache_write=_nano(p.cache_write, where, inp),
                cache_write_1h=_nano(p.cache_write_1h, where, _nano(p.cache_write, where, inp)),
                image=_nano(p.image, where, 0),
                image_input=_nano(p.image_input, where, inp),
            ),
            created=target.created,
            alias_of=spec.alias_of,
            fallbacks=tuple(target.fallbacks),
            shutdown_date=target.shutdown_date,
            tools=target.tools,
            embedding=target.embedding,
            image=target.image,
        )

    @classmethod
    def load(cls, extra: Path | None = None, key_prefix: str = DEFAULT_KEY_PREFIX) -> Catalog:
        base = _decode(BUILTIN)
        providers = dict(base.providers)
        models = {m.id: m for m in base.models}
        source = str(BUILTIN)
        if extra is not None:
            more = _decode(extra)
            providers.update(more.providers)
            models.update({m.id: m for m in more.models})
            source = str(extra)
        return cls(providers, list(models.values()), source, key_prefix)

    def named(
        self, names: dict[str, str], groups: dict[str, dict[str, str]], source: str = "config"
    ) -> Catalog:
        """This catalog with the operator's names (``[models]``): a name → a catalog model, for every
        group or for one group (which wins); a name may hide a catalog id or a bare id."""

        def target(name: str, model_id: str, where: str) -> Model:
            try:
                return self.resolve(model_id)
            except (ModelNotFound, InvalidRequest):
                raise ConfigError(
                    f"{source}: {where}: {name!r} maps to {model_id!r}, which is not in the catalog"
                ) from None

        self._names = {name: target(name, to, "models.map") for name, to in names.items()}
        self._group_names = {
            group: {name: target(name, to, f"models.groups.{group}") for name, to in mapped.items()}
            for group, mapped in groups.items()
        }
        return self

    def resolve(self, model_id: str, group: str | None = None) -> Model:
        """The model a caller means by ``model_id``: the operator's name for its group or for every group,
        a catalog id (any provider alias, any case), or a bare id that names one model (400 if several)."""
        if self._names or self._group_names:
            mapped = self._group_names.get(group or "", {}).get(model_id) or self._names.get(model_id)
            if mapped is not None:
                return mapped
        model = self._lookup.get(model_id)
        if model is None:
            model = self._lookup.get(model_id.lower())
        if model is None:
            candidates = self._ambiguous.get(model_id.lower())
            if candidates:
                raise InvalidRequest(
                    f"The model `{model_id}` is ambiguous: it names {', '.join(candidates)}. Send one "
                    "of these ids.",
                    param="model",
                    code="ambiguous_model",
                )
            hint = ""
            if "/" not in model_id:
                hint = " Model ids have the form '<provider>/<model_name>', e.g. 'openai/gpt-4o-mini'; GET /v1/models lists them."
            raise not_found(redact_keys(model_id, self.key_prefix), hint)
        return model

    def require_endpoint(self, model: Model, model_id: str, endpoint: Endpoint) -> None:
        if endpoint not in model.endpoints:
            serves = ", ".join(f"/v1/{ENDPOINT_PATHS[e]}" for e in sorted(model.endpoints))
            raise InvalidRequest(
                f"The model `{model_id}` is a {model.kind} model and does not serve this endpoint"
                + (f"; it serves {serves}." if serves else "; it serves no endpoint of this gateway."),
                param="model",
                code="unsupported_model_endpoint",
            )
