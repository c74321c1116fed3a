"""The OpenAI Responses API wire, for the group that speaks it natively (p1): a pass-through.

    build_request(provider, body, upstream_model)  -> UpstreamRequest to ``POST {base_url}/responses``
    parse_response(body, model_id, provider)       -> (Response dict with the caller's model id, usage)
    ResponsesRelay.feed(SSE event)                 -> the caller's SSE frames (``event:`` + ``data:``); the
                                                      terminal event is held back as ``terminal`` (a dict)

The body goes upstream as the caller wrote it, with ``model`` set to the upstream name; what comes back
carries the caller's model id again (in the response object and in every event that carries one).
Usage for billing is read from the final response (docs/providers.md, OpenAI Responses). Pure: no I/O.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from adapters.base import USER_AGENT, UpstreamRequest, stream_object
from core.deployments import Deployment
from core.errors import UpstreamError
from core.kept import as_sent
from core.sse import Event, frame_event
from core.wire import TokenUsage

_decode = msgspec.json.Decoder().decode
_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
# an event's fields, each object among them as its fields' bytes (one pass over the event)
_event = msgspec.json.Decoder(
    dict[str, dict[str, msgspec.Raw] | str | int | float | bool | None | list[Any]]
).decode
_encode = msgspec.json.Encoder().encode

# a Response object's fields that echo the request's largest parts (Codex: 30 tools, 8 KB, and its whole
# prompt): passed on as their bytes, never read (decoded, Codex's tools are thousands of objects to make
# and encode again, in the answer and in each of the three events of a stream that carry the response)
ECHOED = frozenset({"tools", "instructions"})

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# events whose deltas are generated output (kept to estimate tokens if usage never comes)
GENERATED = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.custom_tool_call_input.delta",
    }
)


def build_request(deployment: Deployment, body: dict[str, Any], upstream_model: str) -> UpstreamRequest:
    out = dict(body)
    out["model"] = upstream_model
    if "tools" in out:
        out["tools"] = as_sent(out["tools"])  # (Codex's, the same each turn: encoded once for the set)
    headers = {
        "Authorization": f"Bearer {deployment.api_key}",
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }
    if out.get("stream"):
        headers["Accept"] = "text/event-stream"
    return UpstreamRequest(f"{deployment.base_url}/responses", headers, _encode(out))


def usage_from_responses(usage: Any) -> TokenUsage | None:
    """A Responses ``usage`` object → normalised usage (defensive: any field may be missing)."""
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    idetails = usage.get("input_tokens_details") or {}
    odetails = usage.get("output_tokens_details") or {}
    cached = int(idetails.get("cached_tokens") or 0)
    return TokenUsage(
        prompt=prompt,
        completion=completion,
        cached=min(cached, prompt),
        cache_write=int(idetails.get("cache_write_tokens") or 0),
        reasoning=int(odetails.get("reasoning_tokens") or 0),
    )


def output_text(response: dict[str, Any]) -> str:
    """Everything a response generated, as text (to estimate its tokens when usage is missing)."""
    parts: list[str] = []
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        for part in item.get("content") or ():
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("refusal") or ""))
        for part in item.get("summary") or ():
            if isinstance(part, dict):
                parts.append(str(part.get("text") or ""))
        if item.get("type") == "function_call":
            parts.append(str(item.get("name") or "") + str(item.get("arguments") or ""))
    return "".join(parts)


class _Head(msgspec.Struct):
    """What the relay reads of every event; of one that carries no response (most are deltas) only
    this is decoded, the rest skipped, and the event passes as it came."""

    type: Any = None
    sequence_number: Any = None
    delta: Any = None


_head = msgspec.json.Decoder(_Head).decode


def _decoded(fields: dict[str, msgspec.Raw], kept: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An object's fields, decoded but for those named in ``kept`` (left as their bytes)."""
    return {name: value if name in kept else _decode(value) for name, value in fields.items()}


def response_object(data: bytes | msgspec.Raw) -> dict[str, Any]:
    """A Response object's JSON, decoded but for its :data:`ECHOED` fields (``msgspec.Raw``); a
    ``msgspec.ValidationError`` if it is JSON but not an object, a ``DecodeError`` if not JSON."""
    return _decoded(_fields(data), ECHOED)


def _event_object(data: bytes, provider: str) -> dict[str, Any]:
    """:func:`adapters.base.stream_object` of an event that carries a response, decoded in one pass
    that leaves each object's fields as their bytes (``_event``): the response's :data:`ECHOED`
    fields stay so, the rest are decoded."""
    try:
        fields = _event(data)
    except msgspec.DecodeError:  # (not JSON, or not an object: stream_object says which)
        return stream_object(data, provider)
    for name, value in fields.items():
        if value.__class__ is dict:
            fields[name] = _decoded(value, ECHOED) if name == "response" else _decoded(value)
    return fields


def parse_response(
    body: bytes, model_id: str, provider: str, echo: dict[str, Any] | None = None
) -> tuple[dict[str, Any], TokenUsage | None]:
    """The upstream's Response object with the caller's model id (and the fields of ``echo``: what
    the gateway, not the upstream, decides, such as ``store`` and ``previous_response_id``)."""
    try:
        data = response_object(body)
    except msgspec.ValidationError:
        raise UpstreamError(f"The provider '{provider}' returned an unexpected answer shape.") from None
    except msgspec.DecodeError:
        raise UpstreamError(f"The provider '{provider}' returned a body that is not JSON.") from None
    if data.get("object") != "response":
        raise UpstreamError(f"The provider '{provider}' returned an unexpected answer shape.")
    data["model"] = model_id
    if echo:
        data.update(echo)
    return data, usage_from_responses(data.get("usage"))


def _error_message(data: dict[str, Any]) -> str:
    """An ``error`` event's message: the SDK's flat shape or the nested one some proxies send."""
    nested = data.get("error")
    source = nested if isinstance(nested, dict) else data
    return str(source.get("message") or "unknown error")


class ResponsesRelay:
    """One upstream Responses event stream → the caller's frames. After the stream: ``finished`` (a
    terminal event came), ``terminal`` (that event, not framed: its owner frames it), ``usage`` (from
    it), ``error`` (what went wrong upstream, if anything)."""

    __slots__ = (
        "echo",
        "error",
        "finished",
        "generated",
        "model_id",
        "provider",
        "sequence",
        "snapshot",
        "terminal",
        "usage",
    )

    def __init__(self, model_id: str, provider: str, echo: dict[str, Any] | None = None) -> None:
        self.model_id = model_id
        self.echo = echo  # fields set in every response object (see parse_response)
        self.provider = provider
        self.finished = False
        self.usage: TokenUsage | None = None
        self.error: str | None = None
        self.sequence = -1
        self.snapshot: dict[str, Any] | None = None  # the last response object seen
        self.terminal: dict[str, Any] | None = None
        self.generated: list[str] = []

    def feed(self, event: Event) -> list[bytes]:
        if event.data == b"[DONE]" or self.finished:
            return []  # some proxies append [DONE]; nothing may follow a terminal event
        raw = event.data
        carries = raw.find(b'"response"') >= 0
        data: dict[str, Any] | None = None  # the whole event, decoded when it carries a response
        head: _Head | None = None
        if not carries:
            try:
                head = _head(raw)
            except msgspec.DecodeError:  # (not JSON, or not an object: stream_object raises which)
                pass
        if head is None:
            data = _event_object(raw, self.provider) if carries else stream_object(raw, self.provider)
            head = _Head(data.get("type"), data.get("sequence_number"), data.get("delta"))
        kind = str(head.type or event.event or "message")
        if isinstance(head.sequence_number, int):
            self.sequence = max(self.sequence, head.sequence_number)
        if kind in GENERATED and isinstance(head.delta, str):
            self.generated.append(head.delta)
        elif kind == "error":
            self.error = _error_message(data if data is not None else stream_object(raw, self.provider))
        response = data.get("response") if data is not None else None
        if data is None or not isinstance(response, dict):
            return [frame_event(kind, raw)]
        response["model"] = self.model_id
        if self.echo:
            response.update(self.echo)
        self.snapshot = response
        if kind in TERMINAL:
            self.finished = True
            self.usage = usage_from_responses(response.get("usage"))
            if kind == "response.failed":
                error = response.get("error")
                self.error = str(error.get("message")) if isinstance(error, dict) else "the response failed"
            data["type"] = kind
            self.terminal = data
            return []
        return [frame_event(kind, _encode(data))]

    def fail(self, message: str) -> dict[str, Any]:
        """The terminal ``response.failed`` event for a stream the upstream did not end properly."""
        response = dict(
            self.snapshot
            or {
                "id": "resp_" + secrets.token_hex(24),
                "object": "response",
                "created_at": int(time.time()),
                "output": [],
                "model": self.model_id,
            }
        )
        self.error = self.error or message
        response["status"] = "failed"
        response["error"] = {"code": "server_error", "message": self.error}
        self.sequence += 1
        self.finished = True
        event = {"type": "response.failed", "sequence_number": self.sequence, "response": response}
        self.terminal = event
        return event

    def generated_text(self) -> str:
        return "".join(self.generated)
