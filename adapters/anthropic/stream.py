"""Anthropic Messages, the stream: ``event:`` SSE → OpenAI chat completion chunks. Wire facts:
docs/providers.md, Anthropic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from adapters.anthropic.request import JSON_TOOL
from adapters.anthropic.response import (
    error_text,
    finish_reason,
    obj,
    openai_usage,
    usage_from_anthropic,
    with_thinking_share,
)
from adapters.base import REASONING, THINKING_BLOCKS, StreamTranslator, UpstreamStreamError, stream_object
from core.sse import Event

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

Chunks = list[dict[str, Any]]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class AnthropicStream(StreamTranslator):
    """``message_start`` → role chunk; text / thinking / input_json deltas → content / reasoning /
    tool-call argument chunks; ``message_delta`` → the finish chunk and usage; ``message_stop`` → end."""

    def __init__(self, provider: str = "anthropic", json_mode: bool = False) -> None:
        super().__init__()
        self.provider = provider
        self.json_mode = json_mode  # the JSON_TOOL's input is streamed as content
        self.json_block: int | None = None
        self.tools: dict[int, int] = {}  # content block index → OpenAI tool-call index
        self.tool_args: set[int] = set()  # block indexes whose arguments have been sent
        self.raw_usage: dict[str, Any] = {}
        self.thinking: dict[int, list[str]] = {}  # open thinking blocks: index -> [text so far, signature]
        self.thinking_chars = 0  # what thought and what else was said: how output_tokens splits
        self.other_chars = 0
        self.finish_sent = False
        self.handlers: dict[str, Callable[[dict[str, Any]], Chunks]] = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
        }

    def feed(self, event: Event) -> Chunks:
        if not event.data or event.event == "ping":
            return []
        data = stream_object(event.data, self.provider)
        kind = data.get("type") or event.event
        if kind == "error" or event.event == "error":
            raise UpstreamStreamError(f"The provider '{self.provider}' failed mid-stream: {error_text(data)}")
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        return handler(data) if handler is not None else []  # ping and future event types: ignored

    def _message_start(self, data: dict[str, Any]) -> Chunks:
        self.raw_usage = dict(obj(obj(data.get("message")).get("usage")))
        self.prompt_usage = usage_from_anthropic(self.raw_usage)  # exact input counts (output so far: 1)
        return [_chunk({"role": "assistant", "content": ""})]

    def _tool_delta(self, index: int, **fields: Any) -> Chunks:
        return [_chunk({"tool_calls": [{"index": self.tools[index], **fields}]})]

    def _block_start(self, data: dict[str, Any]) -> Chunks:
        block, index = obj(data.get("content_block")), data.get("index")
        kind = block.get("type")
        if (
            kind == "tool_use"
            and self.json_mode
            and block.get("name") == JSON_TOOL
            and self.json_block is None
        ):
            self.json_block = index
            given = block.get("input")
            return [_chunk({"content": _encode(given).decode()})] if isinstance(given, dict) and given else []
        if kind == "tool_use" and isinstance(index, int):
            self.tools[index] = len(self.tools)
            given = block.get("input")
            arguments = _encode(given).decode() if isinstance(given, dict) and given else ""
            if arguments:
                self.tool_args.add(index)
            function = {"name": block.get("name"), "arguments": arguments}
            return self._tool_delta(index, id=block.get("id"), type="function", function=function)
        if kind == "text" and block.get("text"):
            self.other_chars += len(block["text"])
            return [_chunk({"content": block["text"]})]
        if kind == "thinking" and isinstance(index, int):
            text, signature = block.get("thinking"), block.get("signature")
            text = text if isinstance(text, str) else ""
            self.thinking[index] = [text, signature if isinstance(signature, str) else ""]
            if text:
                self.thinking_chars += len(text)
                return [_chunk({REASONING: text})]
        if kind == "redacted_thinking" and isinstance(block.get("data"), str):  # kept whole, shown as nothing
            return [_chunk({THINKING_BLOCKS: [{"type": "redacted_thinking", "data": block["data"]}]})]
        return []

    def _block_delta(self, data: dict[str, Any]) -> Chunks:
        delta, index = obj(data.get("delta")), data.get("index")
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            self.other_chars += len(delta["text"])
            return [_chunk({"content": delta["text"]})]
        if kind == "thinking_delta" and delta.get("thinking"):
            self.thinking_chars += len(delta["thinking"])
            if index in self.thinking:
                self.thinking[index][0] += delta["thinking"]
            return [_chunk({REASONING: delta["thinking"]})]
        if kind == "signature_delta" and index in self.thinking and isinstance(delta.get("signature"), str):
            self.thinking[index][1] += delta["signature"]
            return []
        if kind == "input_json_delta" and index == self.json_block and delta.get("partial_json"):
            self.other_chars += len(delta["partial_json"])
            return [_chunk({"content": delta["partial_json"]})]
        if kind == "input_json_delta" and index in self.tools and delta.get("partial_json"):
            self.other_chars += len(delta["partial_json"])
            self.tool_args.add(index)
            return self._tool_delta(index, function={"arguments": delta["partial_json"]})
        return []  # citations_delta, empty fragments

    def _block_stop(self, data: dict[str, Any]) -> Chunks:
        index = data.get("index")
        thought = self.thinking.pop(index, None) if isinstance(index, int) else None
        if thought is not None:  # the whole block, signed: what a later turn must send back (thinking_blocks)
            return [
                _chunk(
                    {THINKING_BLOCKS: [{"type": "thinking", "thinking": thought[0], "signature": thought[1]}]}
                )
            ]
        if index in self.tools and index not in self.tool_args:  # no input at all: "{}", not ""
            self.tool_args.add(index)
            return self._tool_delta(index, function={"arguments": "{}"})
        return []

    def _set_usage(self) -> None:
        self.usage = with_thinking_share(
            usage_from_anthropic(self.raw_usage), self.thinking_chars, self.other_chars
        )
        if self.usage is not None:
            self.usage_raw = openai_usage(self.usage)

    def _finish(self, stop_reason: Any) -> Chunks:
        if self.finish_sent:
            return []
        self.finish_sent = True
        if self.json_block is not None and not self.tools and stop_reason == "tool_use":
            stop_reason = "end_turn"  # JSON mode: the answer was the tool's input
        return [_chunk({}, finish_reason(stop_reason))]

    def _message_delta(self, data: dict[str, Any]) -> Chunks:
        # usage counts are cumulative: they replace the message_start ones, never add to them
        self.raw_usage.update({k: v for k, v in obj(data.get("usage")).items() if v is not None})
        self._set_usage()
        return self._finish(obj(data.get("delta")).get("stop_reason"))

    def _message_stop(self, data: dict[str, Any]) -> Chunks:
        self.finished = True
        if self.usage is None:
            self._set_usage()
        return self._finish(None)  # a message_delta always comes first; this is only a safety net
