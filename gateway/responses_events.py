"""Chat chunks → the Responses event sequence that OpenAI's Responses API emits (docs/providers.md,
OpenAI Responses), for the groups whose answers are translated from chat:

    response.created, response.in_progress,
    per output item: response.output_item.added, then
        message:       response.content_part.added, response.output_text.delta…, response.output_text.done,
                       response.content_part.done
        reasoning:     the same with response.reasoning_text.delta / .done and a reasoning_text part
        function_call: response.function_call_arguments.delta…, response.function_call_arguments.done
                       (a chat tool call's ``extra_content``, Gemini's thought signature, rides on the item)
    response.output_item.done,
    response.completed | response.incomplete (finish reason length / content_filter) | response.failed

Every event has ``type`` and a ``sequence_number`` counting from 0. One item is open at a time, as in
the API; usage comes only in the terminal event's response. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import time
from typing import Any

from core.types import new_id
from core.wire import usage_from_openai

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


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


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


class EventSynth:
    """Feed it the chat chunks of one answer (:mod:`gateway.stream` order), then ``finish()``."""

    def __init__(self, shell: dict[str, Any]) -> None:
        self.shell = shell  # the Response object without output (see responses_translate.shell)
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # every item so far, in its latest state
        self.pieces: dict[int, list[str]] = {}  # output index → its text / arguments so far
        self.current: int | None = None  # output index of the open item
        self.calls: dict[int, int] = {}  # chat tool-call index → output index
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.done = False

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, **changes: Any) -> dict[str, Any]:
        return {**self.shell, "output": list(self.output), **changes}

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self._response()),
            self._event("response.in_progress", response=self._response()),
        ]

    # -- chunks in --------------------------------------------------------------------------------
    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if self.done:
            return []
        if isinstance(chunk.get("error"), dict):
            return self.fail(chunk["error"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            for field, kind in (("reasoning_content", "reasoning"), ("content", "message")):
                if isinstance(delta.get(field), str) and delta[field]:
                    events += self._text(kind, delta[field])
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
        if kind == "message":
            item = {
                "id": item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
        events = self._open(item)
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

    def _text(self, kind: str, piece: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.current is None or self.output[self.current]["type"] != kind:
            events += self._open_text(kind)
        index = self.current
        assert index is not None
        self.pieces[index].append(piece)
        where = {"item_id": self.output[index]["id"], "output_index": index, "content_index": 0}
        if kind == "message":
            events.append(self._event("response.output_text.delta", **where, delta=piece, logprobs=[]))
        else:
            events.append(self._event("response.reasoning_text.delta", **where, delta=piece))
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function") or {}
        chat_index = call.get("index", 0)
        index = self.calls.get(chat_index)
        events: list[dict[str, Any]] = []
        if index is None:
            item = {
                "id": item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call.get("id") or item_id("call"),
                "name": function.get("name") or "",
            }
            if isinstance(call.get("extra_content"), dict):  # Gemini's thought signature (adapters.gemini)
                item["extra_content"] = call["extra_content"]
            events += self._open(item)
            index = self.calls[chat_index] = len(self.output) - 1
        elif isinstance(call.get("extra_content"), dict):  # came after the call's first piece
            self.output[index] = {**self.output[index], "extra_content": call["extra_content"]}
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self.pieces[index].append(arguments)
            if index == self.current:
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=self.output[index]["id"],
                        output_index=index,
                        delta=arguments,
                    )
                )
            else:  # a late piece of a call already done (no adapter does this): keep it in the final output
                self.output[index] = {**self.output[index], "arguments": "".join(self.pieces[index])}
        return events

    # -- items out --------------------------------------------------------------------------------
    def _final(self, index: int, status: str) -> dict[str, Any]:
        item = self.output[index]
        text = "".join(self.pieces[index])
        if item["type"] == "function_call":
            return {**item, "arguments": text, "status": status}
        return {**item, "content": [_part(item["type"], text)], "status": status}

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
        reason = INCOMPLETE.get(self.finish_reason or "")
        events: list[dict[str, Any]] = []
        if not self.output:  # an empty answer is still one (empty) message
            events += self._open_text("message")
        events += self._close(
            "incomplete" if reason and self.output[-1]["type"] == "message" else "completed"
        )
        changes: dict[str, Any] = {"usage": responses_usage(self.usage)}
        if reason:
            changes.update(status="incomplete", incomplete_details={"reason": reason})
            events.append(self._event("response.incomplete", response=self._response(**changes)))
        else:
            changes.update(status="completed", completed_at=int(time.time()))
            events.append(self._event("response.completed", response=self._response(**changes)))
        return events

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
