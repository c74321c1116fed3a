"""The adapter interface: what every upstream wire protocol implements.

    build_request(call)          -> UpstreamRequest (url, headers, body bytes)
    parse_response(call, body)   -> (OpenAI chat.completion dict, TokenUsage | None)
    stream(call)                 -> StreamTranslator: feed(SSE event) -> [OpenAI chunk dicts]
    error(status, body, headers) -> GatewayError (docs/architecture.md, Errors)

The gateway then normalises what adapters return (ids, model echo, usage placement, chunk order) in
one place, :mod:`gateway.stream`, so adapters only translate.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import msgspec

from core.catalog import Model, ProviderSpec
from core.deployments import Deployment
from core.errors import (
    GatewayError,
    InvalidRequest,
    RateLimited,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamFinal,
    UpstreamNotFound,
    UpstreamQuotaExceeded,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from core.sse import Event
from core.wire import ChatRequest, TokenUsage


@dataclass(slots=True)
class Call:
    """One chat call on its way upstream."""

    model_id: str  # as the caller wrote it; echoed back
    model: Model
    deployment: Deployment  # the deployment that serves it: address, key, kind
    raw: dict[str, Any]  # the decoded request body, unknown fields included
    request: ChatRequest
    stream: bool
    include_usage: bool

    @property
    def upstream_model(self) -> str:
        """The model's name at the deployment serving the call (the catalog's, unless renamed there)."""
        return self.deployment.upstream_name(self.model)


USER_AGENT = "model-router"  # sent upstream with every request (aiohttp's own otherwise)
REASONING = "reasoning_content"  # where every adapter puts reasoning text, on a message or a delta
# Anthropic's thinking blocks whole (text and signature, or redacted data), on an assistant message or a
# delta: what a later turn of a tool loop must send back for thinking to go on (LiteLLM names it the same)
THINKING_BLOCKS = "thinking_blocks"


class UpstreamRequest(NamedTuple):
    url: str
    headers: dict[str, str]
    body: bytes
    max_output: int | None = None  # the output token cap the body asks for, when the adapter raised it
    # above what the caller asked (billing reserves for it: billing.pricing.worst_case)


class StreamTranslator(ABC):
    """Turns one upstream SSE stream into OpenAI chunk dicts. ``finished`` is set when the upstream
    signalled a proper end; ``usage`` when it reported usage. ``passthrough``: its plain chunks are
    OpenAI chunks already, which the stream path may pass on as bytes (gateway/stream.py)."""

    passthrough = False

    def __init__(self) -> None:
        self.finished = False
        self.usage: TokenUsage | None = None
        self.usage_raw: dict[str, Any] | None = None
        self.prompt_usage: TokenUsage | None = None  # the prompt's counts, if told before the end

    @abstractmethod
    def feed(self, event: Event) -> list[dict[str, Any]]: ...


def upstream_request_id(headers: Mapping[str, str]) -> str | None:
    """The upstream's own id of a request, for the usage record: ``x-request-id`` (OpenAI and the
    OpenAI-compatible providers) or ``request-id`` (Anthropic)."""
    return headers.get("x-request-id") or headers.get("request-id")


class UpstreamStreamError(UpstreamFinal):
    """The upstream reported an error inside a stream that had already started."""


_decode = msgspec.json.Decoder().decode


def stream_object(data: bytes, provider: str) -> dict[str, Any]:
    """A stream event's JSON object; anything else is the provider's fault (:class:`UpstreamStreamError`)."""
    try:
        value = _decode(data)
    except msgspec.DecodeError:
        raise UpstreamStreamError(f"The provider '{provider}' sent a malformed stream event.") from None
    if not isinstance(value, dict):
        raise UpstreamStreamError(f"The provider '{provider}' sent an unexpected stream event.")
    return value


def error_message(body: bytes) -> tuple[str | None, str | None]:
    """(message, code) from any provider's error body: nested ``{"error": {...}}`` (OpenAI,
    Anthropic, Gemini), flat ``{"message": ...}`` (Mistral) or FastAPI ``{"detail": [...]}``."""
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        text = body[:200].decode("utf-8", "replace").strip()
        return (text or None), None
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return None, None
    err = data.get("error")
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), str) else err.get("status") or err.get("type")
        return str(err.get("message") or ""), code if isinstance(code, str) else None
    if isinstance(err, str):
        return err, None
    if "message" in data:
        code = data.get("code")
        return str(data["message"]), code if isinstance(code, str) else None
    detail = data.get("detail")
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = ".".join(str(x) for x in first.get("loc", []) if x != "body")
        return f"{first.get('msg', 'invalid')} ({loc})", None
    return None, None


# An upstream's own account is out of credit (docs/providers.md): never retried, unlike a rate limit
OUT_OF_CREDIT = frozenset({"insufficient_quota", "billing_error", "FAILED_PRECONDITION"})


_LIMIT_REQUESTED = re.compile(r"\((\w+)\): Limit (\d+), Requested (\d+)")
# Anthropic's 429 over the organization's input tokens per minute: the same words whether the minute's
# usage or the request alone is over it (docs/providers.md, Errors)
_INPUT_TPM = re.compile(r"of ([\d,]+) input tokens per minute")


def too_large(provider: str, message: str) -> UpstreamTooLarge:
    """OpenAI's "Request too large for gpt-4o in organization org-... on tokens per min (TPM): Limit
    30000, Requested 61337. The input or output tokens must be reduced ...", said again without the
    organization: the limit and what this call asked for are the caller's to know, the account not."""
    found = _LIMIT_REQUESTED.search(message)
    return over_account(provider, f" ({found[1]}): limit {found[2]}, requested {found[3]}" if found else "")


def over_account(provider: str, sizes: str) -> UpstreamTooLarge:
    """A call that alone is over what the gateway's account with ``provider`` may use in a minute
    (``sizes``: the limit and the call's size, for the caller)."""
    return UpstreamTooLarge(
        f"Request too large for the gateway's account with provider '{provider}'{sizes}. The input or output "
        "tokens must be reduced in order to run successfully (a shorter prompt or a lower max_tokens)."
    )


def map_upstream_error(provider: str, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
    """What the caller sees for an upstream HTTP error (docs/architecture.md, Errors)."""
    message, code = error_message(body)
    said = f": {message}" if message else ""
    if status == 402 or code in OUT_OF_CREDIT:
        return UpstreamQuotaExceeded(
            f"The gateway's account with provider '{provider}' is out of credit or quota (upstream HTTP {status}"
            f"{' ' + code if code else ''}){said.rstrip('.')}. This is a gateway billing problem, not your rate limit or credits."
        )
    if status == 429 and message and message.startswith("Request too large for "):
        return too_large(provider, message)
    if status == 429:  # the provider's own words are not passed on: they name the gateway's
        # organization and its usage, which is every tenant's together (docs/providers.md, Errors)
        retry = headers.get("retry-after")
        out = {"Retry-After": retry} if retry else {}
        limited = RateLimited(
            f"The provider '{provider}' is rate limiting the gateway's requests; "
            "try again after the time in Retry-After.",
            headers=out,
        )
        named = _INPUT_TPM.search(message or "")
        if named:  # whether this call alone is over it, the caller's side can tell (gateway/chat_codec.py)
            limited.input_tpm = int(named[1].replace(",", ""))
        return limited
    if status in (401, 403):
        return UpstreamAuthFailed(
            f"The gateway's credentials for provider '{provider}' were rejected (upstream HTTP {status}). "
            "This is a gateway configuration problem, not a problem with your API key."
        )
    if status == 404:  # the deployment lacks the model or the endpoint: the gateway's configuration
        return UpstreamNotFound(
            f"The provider '{provider}' has no such model or endpoint at this deployment "
            f"(upstream HTTP 404){said}. This is a gateway configuration problem."
        )
    if status == 408:
        return UpstreamTimeout(f"The provider '{provider}' timed out reading the request (HTTP 408){said}")
    if 400 <= status < 500:  # what it says about this request's content (the circuit never counts it)
        return InvalidRequest(
            f"The provider '{provider}' rejected the request{said}", code=code or "upstream_rejected"
        )
    if status in (502, 503, 529):
        return UpstreamUnavailable(
            f"The provider '{provider}' is unavailable or overloaded (HTTP {status}){said}"
        )
    if status == 504:
        return UpstreamTimeout(f"The provider '{provider}' timed out (HTTP 504){said}")
    return UpstreamError(f"The provider '{provider}' failed (HTTP {status}){said}")


class Adapter(ABC):
    protocol: ClassVar[str]

    def __init__(self, name: str, spec: ProviderSpec) -> None:
        self.name = name
        self.spec = spec

    @abstractmethod
    def build_request(self, call: Call) -> UpstreamRequest: ...

    @abstractmethod
    def parse_response(self, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]: ...

    def plain_answer(self, call: Call, body: bytes) -> tuple[dict[str, msgspec.Raw], TokenUsage] | None:
        """A non-stream answer that needs no translation, as its top-level fields' bytes and its usage:
        what :meth:`parse_response` would give, left undecoded (the caller only re-encodes it); None
        when this adapter has no such short way or this answer needs the long one."""
        return None

    @abstractmethod
    def stream(self, call: Call) -> StreamTranslator: ...

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        return map_upstream_error(self.name, status, body, headers)
