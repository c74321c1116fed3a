"""The Anthropic Messages protocol (p2: ``anthropic/...``, also ``claude/...``): the request
(:mod:`.request`), the answer (:mod:`.response`) and the stream (:mod:`.stream`), each pure
translation between OpenAI chat and Anthropic's wire. Wire facts: docs/providers.md, Anthropic.
"""

from __future__ import annotations

from typing import Any

from adapters.anthropic.request import build, json_mode, tool_choice
from adapters.anthropic.response import finish_reason, parse
from adapters.anthropic.stream import AnthropicStream
from adapters.base import Adapter, Call, StreamTranslator, UpstreamRequest
from core.wire import TokenUsage


class AnthropicAdapter(Adapter):
    protocol = "anthropic"

    def build_request(self, call: Call) -> UpstreamRequest:
        return build(call)

    def parse_response(self, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
        return parse(self.name, call, body)

    def stream(self, call: Call) -> StreamTranslator:
        return AnthropicStream(self.name, json_mode=json_mode(call.raw))


__all__ = ["AnthropicAdapter", "AnthropicStream", "finish_reason", "tool_choice"]
