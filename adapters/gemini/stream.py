"""Gemini, the stream: ``streamGenerateContent?alt=sse`` events → OpenAI chat completion chunks.

A Gemini stream is data-only SSE without ``[DONE]``: the chunk carrying ``finishReason`` ends it.
Wire facts: docs/providers.md, Gemini.
"""

from __future__ import annotations

from typing import Any

import msgspec

from adapters.base import StreamTranslator, UpstreamStreamError
from adapters.gemini.response import (
    blocked,
    error_of,
    error_text,
    finish_reason,
    read_parts,
    usage_from_gemini,
    with_parts,
)
from core.sse import Event

_decode = msgspec.json.Decoder().decode


class GeminiStream(StreamTranslator):
    """``data: <GenerateContentResponse>`` events → OpenAI chunks. Each event holds only new parts;
    usage is a running total on every event, so the last one wins."""

    def __init__(self, provider: str, candidates: int = 1) -> None:
        super().__init__()
        self.provider = provider
        self.expected = candidates
        self.calls: dict[int, int] = {}  # candidate index → tool calls emitted so far
        self.done: set[int] = set()

    def feed(self, event: Event) -> list[dict[str, Any]]:
        try:
            data = _decode(event.data)
        except msgspec.DecodeError:
            if event.data.strip() == b"[DONE]":
                return []  # not Gemini's, but harmless (a proxy in between)
            raise UpstreamStreamError(
                f"The provider '{self.provider}' sent a malformed stream event."
            ) from None
        err = error_of(data)
        if err is not None:
            raise UpstreamStreamError(f"The provider '{self.provider}' failed mid-stream: {error_text(err)}")
        if not isinstance(data, dict):
            raise UpstreamStreamError(f"The provider '{self.provider}' sent an unexpected stream event.")
        usage = usage_from_gemini(data.get("usageMetadata"))
        if usage is not None:
            self.usage = usage
        candidates = [c for c in data.get("candidates") or () if isinstance(c, dict)]
        if not candidates:
            if not blocked(data):
                return []
            self.finished = True
            return [{"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}]
        choices = [c for c in (self._choice(c, i) for i, c in enumerate(candidates)) if c is not None]
        if len(self.done) >= self.expected:
            self.finished = True
        return [{"choices": choices}] if choices else []

    def _choice(self, candidate: dict[str, Any], position: int) -> dict[str, Any] | None:
        index = candidate.get("index", position)
        if index in self.done:
            return None
        parts = read_parts(candidate.get("content"))
        if parts.calls:
            first = self.calls.get(index, 0)
            for offset, tool_call in enumerate(parts.calls):
                tool_call["index"] = first + offset
            self.calls[index] = first + len(parts.calls)
        delta = with_parts({"content": parts.text} if parts.text else {}, parts)
        reason = candidate.get("finishReason")
        finish = None
        if reason:
            finish = finish_reason(str(reason), self.calls.get(index, 0) > 0)
            self.done.add(index)
        if not delta and finish is None:
            return None
        return {"index": index, "delta": delta, "finish_reason": finish}
