"""Chat chunks → the event stream Anthropic's Messages API emits (docs/api.md, "Messages"), for the
groups whose answers are translated from chat:

    message_start (the message, no content, usage so far), ping,
    per content block: content_block_start, then
        thinking:  thinking_delta…   (a reasoning text; Anthropic's signature is its own: empty here)
        text:      text_delta…
        tool_use:  input_json_delta… (the arguments' JSON, in the pieces the provider sent)
    content_block_stop,
    message_delta (stop_reason, cumulative usage), message_stop

One block is open at a time, as in the API; an error is one ``error`` event. Pure: dicts in, frames out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.errors import GatewayError, anthropic_status
from core.sse import frame_event
from core.templates import HOLES, INTS, hole, template
from gateway.messages_translate import anthropic_usage, stop_reason

_encode = msgspec.json.Encoder().encode


def frame(data: dict[str, Any]) -> bytes:
    return frame_event(data["type"], _encode(data))


# The events the hot path writes as bytes around their values, each defined once (as frame() encodes
# it) and its template derived from that definition at import (core/templates.py).


def message_start(id: str, model: str) -> dict[str, Any]:
    """message_start: the message without content, no usage yet."""
    message: dict[str, Any] = {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": anthropic_usage(None),
    }
    return {"type": "message_start", "message": message}


def block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def text_delta(kind: str, piece: str) -> dict[str, Any]:
    """The delta of a text or thinking block (``kind``)."""
    return {"type": f"{kind}_delta", kind: piece}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


# a text or thinking delta, the one frame of most chunks: its frame up to the block's index, from the
# index to the piece's JSON (by kind), after the piece
_DELTAS = {
    kind: template(frame(block_delta(INTS[0], text_delta(kind, HOLES[0]))), hole(INTS[0]), hole(HOLES[0]))
    for kind in ("text", "thinking")
}
_DELTA, _, _DELTA_END = _DELTAS["text"]
_DELTA_OF = {kind: of for kind, (_, of, _) in _DELTAS.items()}
if any(head != _DELTA or end != _DELTA_END for head, _, end in _DELTAS.values()):
    raise ValueError("the text and thinking deltas differ but in the delta's kind")
_PING = frame({"type": "ping"})
_STOP = frame({"type": "message_stop"})
_BLOCK_STOP, _BLOCK_STOP_END = template(frame(block_stop(INTS[0])), hole(INTS[0]))
# message_start as bytes around the message's id and model, with the ping after it
_START, _START_MODEL, _START_END = template(
    frame(message_start(HOLES[0], HOLES[1])), hole(HOLES[0]), hole(HOLES[1])
)
_START_END += _PING


def error_event(exc: GatewayError) -> bytes:
    """A failure after the stream began: Anthropic's ``error`` event (nothing follows it)."""
    return frame({"type": "error", "error": {"type": anthropic_status(exc)[1], "message": exc.message}})


class MessageSynth:
    """Feed it the chat chunks of one answer (:mod:`gateway.stream` order), then :meth:`finish`; each
    appends the frames it makes to the list it is given."""

    __slots__ = ("id", "model", "index", "open", "head", "calls", "finish_reason", "usage", "done")

    def __init__(self, id: str, model: str) -> None:
        self.id, self.model = id, model  # the message's id, and the model as the caller named it
        self.index = -1  # the open (or last) block's index
        self.open: str | None = None  # its kind
        self.head = b""  # a text or thinking delta frame of the open block, up to the piece's JSON
        self.calls: dict[int, int] = {}  # chat tool-call index → block index
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.done = False

    def start(self) -> bytes:
        """message_start (the message without content, no usage yet) and a ping."""
        return b"".join((_START, _encode(self.id), _START_MODEL, _encode(self.model), _START_END))

    def feed(self, chunk: dict[str, Any], out: list[bytes]) -> None:
        if self.done:
            return
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                thought = delta.get("reasoning_content")
                if thought and isinstance(thought, str):
                    self._text("thinking", thought, out)
                text = delta.get("content")
                if text and isinstance(text, str):
                    if self.open == "text":  # (most chunks: one more piece of the open text block)
                        out.append(b"".join((self.head, _encode(text), _DELTA_END)))
                    else:
                        self._text("text", text, out)
                calls = delta.get("tool_calls")
                if calls:
                    for call in calls:
                        self._call(call, out)
            reason = choice.get("finish_reason")
            if reason:
                self.finish_reason = reason

    def _start(self, block: dict[str, Any], out: list[bytes]) -> None:
        self._close(out)
        self.index += 1
        self.open = block["type"]
        out.append(frame({"type": "content_block_start", "index": self.index, "content_block": block}))

    def _close(self, out: list[bytes]) -> None:
        if self.open is not None:
            self.open = None
            out.append(b"".join((_BLOCK_STOP, str(self.index).encode(), _BLOCK_STOP_END)))

    def _text(self, kind: str, piece: str, out: list[bytes]) -> None:
        if self.open != kind:
            self._start(
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""},
                out,
            )
            self.head = b"".join((_DELTA, str(self.index).encode(), _DELTA_OF[kind]))
        out.append(b"".join((self.head, _encode(piece), _DELTA_END)))

    def _call(self, call: dict[str, Any], out: list[bytes]) -> None:
        position = call.get("index", 0)
        function = call.get("function") or {}
        if position not in self.calls:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{position}",
                "name": function.get("name") or "",
                "input": {},
            }
            self._start(block, out)
            self.calls[position] = self.index
        elif self.calls[position] != self.index:  # (providers send one call's pieces together)
            return
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(frame(block_delta(self.index, delta)))

    def finish(self, out: list[bytes], cost: msgspec.Raw | None = None) -> None:
        """The end of a proper stream: the open block closed, the stop reason and usage."""
        if self.done:
            return
        self.done = True
        self._close(out)
        usage: dict[str, Any] = anthropic_usage(self.usage)
        if cost is not None:
            usage["cost"] = cost
        delta = {"stop_reason": stop_reason(self.finish_reason), "stop_sequence": None}
        out.append(frame({"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(_STOP)
