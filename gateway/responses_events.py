"""Chat chunks → the Responses event sequence that OpenAI's Responses API emits (docs/providers.md,
OpenAI Responses), for the groups whose answers are translated from chat:

    response.created, response.in_progress,
    per output item: response.output_item.added, then
        message:       response.content_part.added, response.output_text.delta…, response.output_text.done,
                       response.content_part.done
        reasoning:     the same with response.reasoning_text.delta / .done and a reasoning_text part, or,
                       when a summary is asked (Options.summary), response.reasoning_summary_part.added,
                       response.reasoning_summary_text.delta…, .done, response.reasoning_summary_part.done
        custom_tool_call: (a free-form tool, sent to the provider as a function of one string ``input``)
                       response.custom_tool_call_input.delta, .done, once the whole input is known
        function_call: response.function_call_arguments.delta…, response.function_call_arguments.done
                       (a chat tool call's ``extra_content``, Gemini's thought signature, rides on the item)
    response.output_item.done,
    response.completed | response.incomplete (finish reason length / content_filter) | response.failed

Every event has ``type`` and a ``sequence_number`` counting from 0. One item is open at a time, as in
the API; usage comes only in the terminal event's response. A function call keeps the name and
``namespace`` the caller gave its tool (Options.names). When the caller asked for encrypted reasoning
(Options.seal), the provider's state of a tool turn (Anthropic's signed thinking blocks, Gemini's
thought signatures) goes out last, sealed into a reasoning item, for the next turn to send back.
Pure: dicts in, dicts out (but a message's text deltas, and ``response.created`` and ``.in_progress``
with the snapshot they share encoded once, as their SSE frames).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from core.sse import frame_event
from core.templates import HOLES, INTS, formatting, hole, template
from core.types import new_id
from core.wire import usage_from_openai

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


_encode = msgspec.json.Encoder().encode


def text_delta(sequence: int, item: str, index: int, delta: str) -> dict[str, Any]:
    """``response.output_text.delta``: a piece of the text of message ``item`` at output ``index``
    (key order as EventSynth._event builds an event)."""
    return {
        "type": "response.output_text.delta",
        "sequence_number": sequence,
        "item_id": item,
        "output_index": index,
        "content_index": 0,
        "delta": delta,
        "logprobs": [],
    }


def opening(kind: str, sequence: int, response: Any) -> dict[str, Any]:
    """``response.created`` or ``.in_progress`` (``kind``), with the response as it starts."""
    return {"type": kind, "sequence_number": sequence, "response": response}


def _frame(event: dict[str, Any]) -> bytes:
    return frame_event(event["type"], _encode(event))


# The frame of a text delta, derived from text_delta at import (core/templates.py): a %-format whose
# item id (%b, encoded) and output index (%d) _text_delta fills once per message, leaving a %-format
# of the sequence number (%d) and the delta (%b, encoded) for each piece.
_TEXT_DELTA = formatting(
    tuple(
        piece.replace(b"%", b"%%")
        for piece in template(
            _frame(text_delta(INTS[0], HOLES[0], INTS[1], HOLES[1])),
            hole(INTS[0]),
            hole(HOLES[0]),
            hole(INTS[1]),
            hole(HOLES[1]),
        )
    ),
    b"%%d",
    b"%b",
    b"%d",
    b"%%b",
)


def _text_delta(item: bytes, index: int) -> bytes:
    """The frame of a text delta of one message (``item``: its id, encoded), left to fill: the
    sequence number and the delta, encoded."""
    return _TEXT_DELTA % (item, index)


def _opening(kind: str) -> tuple[bytes, bytes]:
    """The frame of ``response.created`` or ``.in_progress``, derived from opening at import: up to its
    response (a %-format of its sequence number), and after the response."""
    head, between, tail = template(_frame(opening(kind, INTS[0], HOLES[0])), hole(INTS[0]), hole(HOLES[0]))
    return formatting((head, between), b"%d"), tail


# the frames of the two events that open a stream, written around the one snapshot they share:
# _CREATED, the snapshot, _IN_PROGRESS (the end of the first frame, the second up to its response),
# the snapshot, _OPENED
_CREATED, _CREATED_END = _opening("response.created")
_IN_PROGRESS_HEAD, _OPENED = _opening("response.in_progress")
_IN_PROGRESS = _CREATED_END.replace(b"%", b"%%") + _IN_PROGRESS_HEAD


def item_id(prefix: str) -> str:
    return f"{prefix}_{new_id()}{new_id()}"


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """A chat usage object → a Responses usage object."""
    normal = usage_from_openai(usage)
    if normal is None:
        return None
    output_details: dict[str, Any] = {"reasoning_tokens": normal.reasoning}
    if normal.reasoning_estimated:
        output_details["reasoning_tokens_estimated"] = True
    return {
        "input_tokens": normal.prompt,
        "input_tokens_details": {"cached_tokens": normal.cached, "cache_write_tokens": normal.cache_write},
        "output_tokens": normal.completion,
        "output_tokens_details": output_details,
        "total_tokens": normal.prompt + normal.completion,
    }


_SUMMARY_EMPTY = {"type": "summary_text", "text": ""}


def custom_input(arguments: str) -> str:
    """A free-form tool's input from the arguments the provider gave its function (``{"input": ...}``)."""
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return arguments
    given = value.get("input") if isinstance(value, dict) else None
    return given if isinstance(given, str) else arguments


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def new_item(kind: str, summary: bool = False) -> dict[str, Any]:
    """An item of text as it opens: a message, or reasoning (its text as summary parts when ``summary``)."""
    if kind == "message":
        return {
            "id": item_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
    if summary:
        return {"id": item_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
    return {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}


def call_item(call: dict[str, Any], names: Mapping[str, Any]) -> dict[str, Any]:
    """A chat tool call's item as it opens: a function call named as the caller named its tool, or a
    free-form tool's call; a call's ``extra_content`` (Gemini's thought signature) rides on it."""
    name = (call.get("function") or {}).get("name") or ""
    known = names.get(name)
    if known is not None and known.custom:  # a free-form tool: its input once whole (see final)
        item = {
            "id": item_id("ctc"),
            "type": "custom_tool_call",
            "status": "in_progress",
            "call_id": call.get("id") or item_id("call"),
            "input": "",
            "name": known.name,
        }
    else:
        item = {
            "id": item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call.get("id") or item_id("call"),
            "name": known.name if known is not None else name,
        }
        if known is not None and known.namespace is not None:
            item["namespace"] = known.namespace
    if isinstance(call.get("extra_content"), dict):
        item["extra_content"] = call["extra_content"]
    return item


def final(item: dict[str, Any], text: str, status: str) -> dict[str, Any]:
    """An item closed with its whole text (a call's arguments, a free-form tool's input)."""
    if item["type"] == "function_call":
        return {**item, "arguments": text, "status": status}
    if item["type"] == "custom_tool_call":
        return {**item, "input": custom_input(text), "status": status}
    if item["type"] == "reasoning" and "content" not in item:  # (a summary)
        return {**item, "summary": [{"type": "summary_text", "text": text}], "status": status}
    return {**item, "content": [_part(item["type"], text)], "status": status}


def closing(finish_reason: str | None, item: dict[str, Any]) -> str:
    """The status of the item open when the answer ends: a message cut short is incomplete."""
    return "incomplete" if INCOMPLETE.get(finish_reason or "") and item["type"] == "message" else "completed"


def sealed_item(
    output: list[dict[str, Any]], blocks: list[Any], seal: Callable[[dict[str, Any]], str] | None
) -> dict[str, Any] | None:
    """A tool turn's provider state as a last reasoning item whose ``encrypted_content`` the gateway
    sealed (when the caller asked for it): thinking blocks, thought signatures, the turn's call ids."""
    calls = [item for item in output if item["type"] in ("function_call", "custom_tool_call")]
    if seal is None or not calls:
        return None
    signatures = {c["call_id"]: c["extra_content"] for c in calls if isinstance(c.get("extra_content"), dict)}
    if not blocks and not signatures:
        return None
    state = {"b": blocks, "s": signatures, "c": [c["call_id"] for c in calls]}
    return {
        "id": item_id("rs"),
        "type": "reasoning",
        "summary": [],
        "encrypted_content": seal(state),
        "status": "completed",
    }


def ended(
    shell: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None, usage: Any
) -> tuple[str, dict[str, Any]]:
    """The terminal event's type and the finished response: incomplete when the provider stopped at the
    output cap or its content filter, else completed."""
    changes: dict[str, Any] = {"usage": responses_usage(usage)}
    reason = INCOMPLETE.get(finish_reason or "")
    if reason:
        kind = "response.incomplete"
        changes.update(status="incomplete", incomplete_details={"reason": reason})
    else:
        kind = "response.completed"
        changes.update(status="completed", completed_at=int(time.time()))
    return kind, {**shell, "output": list(output), **changes}


@dataclass(frozen=True, slots=True)
class Options:
    """How the answer is written: thinking as summary parts, the caller's names of the functions the
    provider was given (chat name → responses_translate.ToolName), and the sealer of provider state."""

    summary: bool = False
    names: Mapping[str, Any] = field(default_factory=dict)
    seal: Callable[[dict[str, Any]], str] | None = None


PLAIN = Options()


class EventSynth:
    """Feed it the chat chunks of one answer (:mod:`gateway.stream` order), then ``finish()``."""

    def __init__(self, shell: dict[str, Any], options: Options | None = None) -> None:
        self.shell = shell  # the Response object without output (see responses_translate.shell)
        self.options = options or PLAIN
        self.blocks: list[Any] = []  # the provider's thinking blocks, signed (Anthropic), to seal
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # every item so far, in its latest state
        self.pieces: dict[int, list[str]] = {}  # output index → its text / arguments so far
        self.current: int | None = None  # output index of the open item
        self.calls: dict[int, int] = {}  # chat tool-call index → output index
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.done = False
        self.writing: int | None = None  # output index of the message whose text deltas self._delta frames
        self._delta = b""

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, **changes: Any) -> dict[str, Any]:
        return {**self.shell, "output": list(self.output), **changes}

    def start(self) -> list[bytes]:
        """``response.created`` and ``.in_progress`` as their frames: the same snapshot (with its echo
        of the request's tools: Codex's are 8 KB), encoded once and copied once into each."""
        snapshot = _encode(self._response())
        first = self.sequence
        self.sequence += 2
        return [b"".join((_CREATED % first, snapshot, _IN_PROGRESS % (first + 1), snapshot, _OPENED))]

    # -- chunks in --------------------------------------------------------------------------------
    def feed(self, chunk: dict[str, Any]) -> list[Any]:
        """The events of one chat chunk: dicts, and a message's text deltas as their SSE frames
        (``bytes``: ``responses_codec.frames`` passes them as they are)."""
        if self.done:
            return []
        error = chunk.get("error")
        if error is not None and isinstance(error, dict):
            return self.fail(error)
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        events: list[Any] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta:
                text = delta.get("reasoning_content")
                if text and isinstance(text, str):
                    events += self._text("reasoning", text)
                text = delta.get("content")
                if text and isinstance(text, str):
                    if self.current is not None and self.current == self.writing:  # (most chunks)
                        events.append(self._delta % (self.sequence, _encode(text)))
                        self.pieces[self.current].append(text)
                        self.sequence += 1
                    else:
                        events += self._text("message", text)
                if len(delta) > 1 or text is None:  # (else a delta of text alone)
                    if isinstance(delta.get("thinking_blocks"), list):
                        self.blocks += delta["thinking_blocks"]
                    for call in delta.get("tool_calls") or ():
                        events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        index = len(self.output)
        self.output.append(item)
        self.pieces[index] = []
        self.current = index
        events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        return events

    def _open_text(self, kind: str) -> list[dict[str, Any]]:
        summary = kind != "message" and self.options.summary
        item = new_item(kind, summary)
        events = self._open(item)
        if summary:
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=self.current,
                    summary_index=0,
                    part=_SUMMARY_EMPTY,
                )
            )
            return events
        events.append(
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.current,
                content_index=0,
                part=_part(kind, ""),
            )
        )
        return events

    def _text(self, kind: str, piece: str) -> list[Any]:
        events: list[Any] = []
        if self.current is None or self.output[self.current]["type"] != kind:
            events += self._open_text(kind)
        index = self.current
        assert index is not None
        self.pieces[index].append(piece)
        # (most of a stream's events: written as their frame, as _event and frames would)
        if kind == "message":
            if self.writing != index:
                self._delta = _text_delta(_encode(self.output[index]["id"]), index)
                self.writing = index
            events.append(self._delta % (self.sequence, _encode(piece)))
            self.sequence += 1
            return events
        where = {"item_id": self.output[index]["id"], "output_index": index, "content_index": 0}
        if self.options.summary:
            events.append(
                self._event(
                    "response.reasoning_summary_text.delta",
                    item_id=where["item_id"],
                    output_index=index,
                    summary_index=0,
                    delta=piece,
                )
            )
        else:
            events.append(self._event("response.reasoning_text.delta", **where, delta=piece))
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function") or {}
        chat_index = call.get("index", 0)
        index = self.calls.get(chat_index)
        events: list[dict[str, Any]] = []
        if index is None:
            events += self._open(call_item(call, self.options.names))
            index = self.calls[chat_index] = len(self.output) - 1
        elif isinstance(call.get("extra_content"), dict):  # came after the call's first piece
            self.output[index] = {**self.output[index], "extra_content": call["extra_content"]}
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self.pieces[index].append(arguments)
            if index != self.current:  # a late piece of a call already done (no adapter does this): keep it
                self.output[index] = self._final(index, self.output[index]["status"])
            # (a free-form input goes out whole, at its end)
            elif self.output[index]["type"] == "function_call":
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=self.output[index]["id"],
                        output_index=index,
                        delta=arguments,
                    )
                )
        return events

    # -- items out --------------------------------------------------------------------------------
    def _final(self, index: int, status: str) -> dict[str, Any]:
        return final(self.output[index], "".join(self.pieces[index]), status)

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        index, self.current = self.current, None
        if index is None:
            return []
        item = self.output[index] = self._final(index, status)
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        elif item["type"] == "custom_tool_call":
            events = [
                self._event("response.custom_tool_call_input.delta", **where, delta=item["input"]),
                self._event("response.custom_tool_call_input.done", **where, input=item["input"]),
            ]
        elif item["type"] == "reasoning" and "content" not in item:
            part = item["summary"][0]
            events = [
                self._event(
                    "response.reasoning_summary_text.done", **where, summary_index=0, text=part["text"]
                ),
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part),
            ]
        else:
            part = item["content"][0]
            done = (
                "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            )
            extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
            events = [
                self._event(done, **where, content_index=0, text=part["text"], **extra),
                self._event("response.content_part.done", **where, content_index=0, part=part),
            ]
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The answer ended normally: close the open item, then the terminal event with the response."""
        if self.done:
            return []
        self.done = True
        events: list[dict[str, Any]] = []
        if not self.output:  # an empty answer is still one (empty) message
            events += self._open_text("message")
        events += self._close(closing(self.finish_reason, self.output[-1]))
        events += self._sealed()
        kind, response = ended(self.shell, self.output, self.finish_reason, self.usage)
        events.append(self._event(kind, response=response))
        return events

    def _sealed(self) -> list[dict[str, Any]]:
        """A tool turn's provider state as the last output item (:func:`sealed_item`)."""
        item = sealed_item(self.output, self.blocks, self.options.seal)
        if item is None:
            return []
        index = len(self.output)
        self.output.append(item)
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The answer broke off: ``response.failed`` with what was generated so far (items incomplete)."""
        if self.done:
            return []
        self.done = True
        if self.current is not None:
            self.output[self.current] = self._final(self.current, "incomplete")
            self.current = None
        code = "rate_limit_exceeded" if error.get("code") == "rate_limit_exceeded" else "server_error"
        failure = {"code": code, "message": str(error.get("message") or "The provider failed mid-stream.")}
        return [self._event("response.failed", response=self._response(status="failed", error=failure))]


def whole(
    shell: dict[str, Any],
    message: dict[str, Any],
    finish_reason: str | None,
    usage: Any,
    options: Options | None = None,
) -> dict[str, Any]:
    """A whole chat answer's ``message`` → the finished Response: the items :class:`EventSynth` gives
    for it streamed (its reasoning, its text, its calls, then the sealed state), made by the same
    rules without making the events."""
    how = options or PLAIN
    opened: list[tuple[dict[str, Any], str]] = []
    for kind, name in (("reasoning", "reasoning_content"), ("message", "content")):
        text = message.get(name)
        if text and isinstance(text, str):
            opened.append((new_item(kind, kind != "message" and how.summary), text))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, dict):
            arguments = (call.get("function") or {}).get("arguments")
            opened.append((call_item(call, how.names), arguments if isinstance(arguments, str) else ""))
    if not opened:  # an empty answer is still one (empty) message
        opened.append((new_item("message"), ""))
    last = len(opened) - 1
    output = [
        final(item, text, "completed" if i < last else closing(finish_reason, item))
        for i, (item, text) in enumerate(opened)
    ]
    blocks = message.get("thinking_blocks")
    sealed = sealed_item(output, blocks if isinstance(blocks, list) else [], how.seal)
    if sealed is not None:
        output.append(sealed)
    return ended(shell, output, finish_reason, usage or None)[1]
