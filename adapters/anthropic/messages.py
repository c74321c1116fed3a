"""The Anthropic Messages API passed through, for ``POST /v1/messages`` on an ``anthropic/...`` model:

    build_request(deployment, body, upstream_model, headers) -> UpstreamRequest to ``{base_url}/messages``
    parse_message(body, model_id, provider)                  -> (the message with the caller's model id, usage)
    MessagesRelay.feed(SSE event)                            -> the caller's SSE frames, event by event

The body goes upstream as the caller wrote it with ``model`` set to the upstream name; the caller's
``anthropic-version`` and ``anthropic-beta`` headers go with it. What comes back is the provider's
answer with the caller's model id (in ``message_start`` for a stream); every other event is relayed as
it came. Usage for billing: ``input_tokens`` (the uncached part), both cache counts and
``output_tokens``, read from ``message_start`` and the cumulative ``message_delta``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from adapters.anthropic.request import VERSION
from adapters.anthropic.response import error_text, usage_from_anthropic
from adapters.base import USER_AGENT, UpstreamRequest, stream_object
from core.deployments import Deployment
from core.errors import UpstreamError
from core.kept import as_sent
from core.sse import Event, frame_event
from core.wire import TokenUsage

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

FORWARDED = ("anthropic-version", "anthropic-beta")  # the caller's headers that go upstream as sent
_GENERATED = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def build_request(
    deployment: Deployment, body: dict[str, Any], upstream_model: str, forwarded: Mapping[str, str]
) -> UpstreamRequest:
    out = dict(body)
    out["model"] = upstream_model
    if "tools" in out:
        out["tools"] = as_sent(out["tools"])  # (Claude Code's, the same each turn: encoded once for the set)
    headers = {
        "x-api-key": deployment.api_key,
        "anthropic-version": forwarded.get("anthropic-version") or VERSION,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    beta = forwarded.get("anthropic-beta")
    if beta:
        headers["anthropic-beta"] = beta
    if out.get("stream"):
        headers["accept"] = "text/event-stream"
    cap = body.get("max_tokens")
    return UpstreamRequest(
        f"{deployment.base_url}/messages", headers, _encode(out), cap if isinstance(cap, int) else None
    )


def count_request(
    deployment: Deployment, body: dict[str, Any], upstream_model: str, forwarded: Mapping[str, str]
) -> UpstreamRequest:
    """``POST {base_url}/messages/count_tokens`` for ``body`` (Anthropic's own count; never billed)."""
    request = build_request(deployment, {**body, "stream": False}, upstream_model, forwarded)
    out = {name: value for name, value in _decode(request.body).items() if name in COUNTED}
    headers = {k: v for k, v in request.headers.items() if k != "accept"}
    return UpstreamRequest(f"{deployment.base_url}/messages/count_tokens", headers, _encode(out))


# the fields Anthropic's count_tokens takes (MessageCountTokensParams)
COUNTED = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "mcp_servers",
        "context_management",
        "output_config",
        "output_format",
        "cache_control",
    }
)


def parse_message(body: bytes, model_id: str, provider: str) -> tuple[dict[str, Any], TokenUsage | None]:
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        raise UpstreamError(f"The provider '{provider}' returned a body that is not JSON.") from None
    if (
        not isinstance(data, dict)
        or data.get("type") != "message"
        or not isinstance(data.get("content"), list)
    ):
        if isinstance(data, dict) and data.get("type") == "error":
            raise UpstreamError(f"The provider '{provider}' failed: {error_text(data)}")
        raise UpstreamError(f"The provider '{provider}' returned an unexpected answer shape.")
    data["model"] = model_id
    return data, usage_from_anthropic(data.get("usage"))


def message_text(message: dict[str, Any]) -> str:
    """Everything a message generated, as text (to estimate its tokens when usage is missing)."""
    parts: list[str] = []
    for block in message.get("content") or ():
        if isinstance(block, dict):
            value = (
                block.get("text")
                or block.get("thinking")
                or (block.get("input") if block.get("type") == "tool_use" else "")
            )
            parts.append(value if isinstance(value, str) else _encode(value).decode())
    return "".join(parts)


class MessagesRelay:
    """One upstream Messages event stream → the caller's frames. After the stream: ``finished``
    (``message_stop`` came), ``usage`` (the latest ``message_delta``'s cumulative counts; None before
    one came), ``prompt_usage`` (the prompt's, from ``message_start``), ``error`` (an ``error`` event's
    text). A stream cut before its ``message_delta`` is billed for the prompt and what it generated.
    The last ``message_delta`` and ``message_stop`` are held (``delta``, ``stop``) for :meth:`tail`,
    so the call's charge can go into that delta's usage once it is known (they come last, together)."""

    __slots__ = (
        "error",
        "finished",
        "generated",
        "model_id",
        "provider",
        "prompt_usage",
        "usage",
        "_counts",
        "delta",
        "stop",
    )

    def __init__(self, model_id: str, provider: str) -> None:
        self.model_id = model_id
        self.provider = provider
        self.finished = False
        self.error: str | None = None
        self.usage: TokenUsage | None = None
        self.prompt_usage: TokenUsage | None = None
        self.generated: list[str] = []
        self._counts: dict[str, Any] = {}  # the usage fields seen so far (message_delta's are cumulative)
        self.delta: dict[str, Any] | None = None  # the last message_delta, held
        self.stop: bytes = b""  # message_stop's frame, held

    def feed(self, event: Event) -> list[bytes]:
        kind = event.event
        if kind == "ping" or self.finished:
            return [frame_event("ping", event.data)] if kind == "ping" else []
        data = stream_object(event.data, self.provider)
        kind = str(data.get("type") or kind or "message")
        if kind == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                piece = delta.get(_GENERATED.get(str(delta.get("type")), ""))
                if isinstance(piece, str):
                    self.generated.append(piece)
            return [frame_event(kind, event.data)]
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                message["model"] = self.model_id
                # (its output count is not the answer's)
                self.prompt_usage = self._count(message.get("usage"))
                return [frame_event(kind, _encode(data))]
        elif kind == "message_delta":
            self.usage = self._count(data.get("usage"))
            out = self.tail()  # (one held before it goes first)
            self.delta = data
            return out
        elif kind == "message_stop":
            self.finished = True
            self.stop = frame_event(kind, event.data)
            return []
        elif kind == "error":  # the stream's end: nothing follows it
            error = data.get("error")
            self.error = (
                str(error.get("message") or error.get("type")) if isinstance(error, dict) else "error"
            )
            self.finished = True
            return [*self.tail(), frame_event(kind, event.data)]
        return [frame_event(kind, event.data)]

    def tail(self, cost: Any = None) -> list[bytes]:
        """What was held, to go out now: the last ``message_delta`` (with ``cost`` in its usage, if
        given) and ``message_stop``."""
        out = []
        if self.delta is not None:
            if cost is not None:
                usage = self.delta.get("usage")
                self.delta["usage"] = {**(usage if isinstance(usage, dict) else {}), "cost": cost}
            out.append(frame_event("message_delta", _encode(self.delta)))
            self.delta = None
        if self.stop:
            out.append(self.stop)
            self.stop = b""
        return out

    def _count(self, usage: Any) -> TokenUsage | None:
        """The counts so far, with ``usage``'s (message_delta's are cumulative, and may leave some out)."""
        if isinstance(usage, dict):
            self._counts.update({k: v for k, v in usage.items() if v is not None})
        return usage_from_anthropic(self._counts)

    def generated_text(self) -> str:
        return "".join(self.generated)
