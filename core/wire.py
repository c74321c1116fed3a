"""msgspec structs for the wire bodies of the OpenAI chat protocol that the gateway speaks.

Inbound structs validate; they are lenient (unknown fields are accepted) because the decoded ``dict``
is kept beside them and passed through to OpenAI-protocol upstreams untouched. Outbound structs use
``omit_defaults`` so that fields we did not set are not sent.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from core.errors import InvalidRequest
from core.inputs import decode_object
from core.kept import Shared, once

# ------------------------------------------------------------------ inbound: chat completion request


class Base(msgspec.Struct, omit_defaults=True):
    """Options shared by every wire struct."""


class ImageURL(Base):
    url: str
    detail: str | UnsetType = UNSET


class TextPart(Base, tag="text"):
    text: str


class ImagePart(Base, tag="image_url"):
    image_url: ImageURL | str  # Mistral also accepts a plain string


class RefusalPart(Base, tag="refusal"):
    refusal: str


class AudioPart(Base, tag="input_audio"):
    input_audio: dict[str, Any]


class FilePart(Base, tag="file"):
    file: dict[str, Any]


ContentPart = TextPart | ImagePart | RefusalPart | AudioPart | FilePart


class FunctionCall(Base):
    name: str
    arguments: str


class CustomCall(Base):
    name: str
    input: str


# OpenAI custom tools (``type: custom``, free-form input) exist only at OpenAI: their raw dict passes through
# to openai/* models and pipeline.check refuses them for every other provider, so the adapters, which
# translate function tools, never meet one. A custom tool or call has a placeholder ``function``.
class _NoCall(FunctionCall):
    pass


class ToolCall(Base):
    id: str
    function: FunctionCall = msgspec.field(default_factory=lambda: _NoCall(name="", arguments=""))
    custom: CustomCall | UnsetType = UNSET
    type: str = "function"

    def __post_init__(self) -> None:
        _require(self.type, type(self.function) is _NoCall, self.custom)


def _require(kind: str, no_function: bool, custom: Any) -> None:
    if kind == "custom" and custom is UNSET:
        raise ValueError("Object missing required field `custom`")
    if kind != "custom" and no_function:
        raise ValueError("Object missing required field `function`")


class Message(Base):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET


class StreamOptions(Base):
    include_usage: bool = False


class FunctionDef(Base):
    name: str
    description: str | UnsetType = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


class CustomDef(Base):
    name: str
    description: str | UnsetType = UNSET
    format: dict[str, Any] | UnsetType = UNSET


class _NoFunction(FunctionDef):
    pass


class Tool(Base):
    function: FunctionDef = msgspec.field(default_factory=lambda: _NoFunction(name=""))  # see _NoCall
    custom: CustomDef | UnsetType = UNSET
    type: str = "function"

    def __post_init__(self) -> None:
        _require(self.type, type(self.function) is _NoFunction, self.custom)


OutputCap = Annotated[int, Meta(ge=1, le=100_000_000)]
MAX_MESSAGES = 20_000


class ChatRequest(Base):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: OutputCap | None = None
    max_completion_tokens: OutputCap | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    stop: str | list[str] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @property
    def output_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def custom_tools_at(self) -> str | None:
        """Where the request uses an OpenAI custom tool (``tools`` or a call in ``messages``), if it does."""
        if self.tools and any(tool.type == "custom" for tool in self.tools):
            return "tools"
        for message in self.messages:  # (no generator per message: this runs on every call)
            calls = message.tool_calls
            if isinstance(calls, list) and calls and any(call.type == "custom" for call in calls):
                return "messages"
        return None

    def has_images(self) -> bool:
        for message in self.messages:
            if isinstance(message.content, list):
                for part in message.content:
                    if isinstance(part, ImagePart):
                        return True
        return False


def chat_struct(chat: dict[str, Any]) -> ChatRequest:
    """``chat`` (a decoded chat request, or one the gateway made of another endpoint's) as a
    :class:`ChatRequest`; its tools, when they are a kept set (:class:`core.kept.Shared`), converted
    once for the set."""
    tools = chat.get("tools")
    if type(tools) is not Shared:
        return msgspec.convert(chat, ChatRequest)
    try:
        structs = once(tools, Tool, _tool_structs)
    except msgspec.ValidationError:
        return msgspec.convert(chat, ChatRequest)  # (raises it again, with the field's whole path)
    request = msgspec.convert({**chat, "tools": None}, ChatRequest)
    request.tools = structs
    return request


def _tool_structs(tools: list[Any]) -> list[Tool]:
    return msgspec.convert(tools, list[Tool])


_AT = re.compile(r" - at `\$\.?(.*)`$")


def parse_chat_request(body: bytes) -> tuple[dict[str, Any], ChatRequest]:
    """Decode and validate a chat request; returns the raw dict (for pass-through) and the struct."""
    raw, _ = decode_object(body, "tools")  # (an agent's tools, the same each turn: decoded once)
    if not isinstance(raw, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    for required in ("model", "messages"):
        if required not in raw:
            raise InvalidRequest(
                f"Missing required parameter: '{required}'.",
                param=required,
                code="missing_required_parameter",
            )
    try:
        request = chat_struct(raw)
    except RecursionError:
        raise InvalidRequest("The JSON body is nested too deeply.", code="invalid_json") from None
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT.search(text)
        param = match.group(1) if match else None
        message = _AT.sub("", text)
        if param == "messages" and "length" in message:
            message = f"'messages' must hold between 1 and {MAX_MESSAGES} messages"
        raise InvalidRequest(
            f"Invalid value for '{param}': {message}." if param else f"Invalid request: {message}.",
            param=param,
            code="invalid_value",
        ) from None
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    return raw, request


# ------------------------------------------------------------------ outbound: models list


class Pricing(msgspec.Struct):
    input: str
    output: str
    cached_input: str
    cache_write: str | UnsetType = UNSET  # shown when it differs from input (Anthropic's prompt caching)
    cache_write_1h: str | UnsetType = UNSET  # a cache write kept for an hour, where it has its own price
    image_input: str | UnsetType = UNSET  # input images' tokens, where they differ from input (gpt-image)
    image: str | UnsetType = UNSET  # credits per generated image (Imagen), not per 1M tokens
    unit: str = "credits per 1M tokens"


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    kind: str
    endpoints: list[str]
    image_input: bool
    tools: bool
    context_length: int
    max_output_tokens: int
    pricing: Pricing
    object: str = "model"
    alias_of: str | None = None
    shutdown_date: str | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


# ------------------------------------------------------------------ usage (normalised)


class TokenUsage(msgspec.Struct, kw_only=True):
    """Usage of one call, normalised across providers. ``completion`` includes ``reasoning``;
    ``prompt`` includes ``cached`` and ``cache_write``."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cache_write: int = 0
    # of ``cache_write``, what is kept for an hour (Anthropic's ttl "1h": its own price)
    cache_write_1h: int = 0
    reasoning: int = 0
    reasoning_estimated: bool = False  # the provider counts reasoning inside completion only (Anthropic)
    image_prompt: int = 0  # of ``prompt``, the input images' tokens (gpt-image edits: their own price)
    images: int = 0  # images generated, billed per image (Imagen)

    def openai(self) -> dict[str, Any]:
        details: dict[str, Any] = {"reasoning_tokens": self.reasoning}
        if self.reasoning_estimated:
            details["reasoning_tokens_estimated"] = True
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
            "completion_tokens_details": details,
        }


def with_details(usage: dict[str, Any], normal: TokenUsage) -> dict[str, Any]:
    """An OpenAI-shaped usage object with both details objects, as OpenAI always sends them (client code
    reads ``usage.completion_tokens_details.reasoning_tokens``): Mistral's lack them."""
    if "completion_tokens_details" in usage and "prompt_tokens_details" in usage:
        return usage
    out = dict(usage)
    if not isinstance(out.get("prompt_tokens_details"), dict):
        out["prompt_tokens_details"] = {"cached_tokens": normal.cached}
    if not isinstance(out.get("completion_tokens_details"), dict):
        out["completion_tokens_details"] = {"reasoning_tokens": normal.reasoning}
    return out


def usage_from_openai(usage: dict[str, Any] | None) -> TokenUsage | None:
    """Read an OpenAI-shaped usage object (also DeepSeek's and Mistral's extras) defensively: a count
    that is not a number (nor a numeric string) counts 0, a details field that is not an object is
    empty."""
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    pdetails = _object(usage.get("prompt_tokens_details"))
    cdetails = _object(usage.get("completion_tokens_details"))
    cached = _count(pdetails.get("cached_tokens") or usage.get("prompt_cache_hit_tokens"))
    return TokenUsage(
        prompt=prompt,
        completion=completion,
        cached=min(cached, prompt),
        cache_write=_count(pdetails.get("cache_write_tokens")),
        reasoning=_count(cdetails.get("reasoning_tokens")),
        reasoning_estimated=cdetails.get("reasoning_tokens_estimated") is True,
    )


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
