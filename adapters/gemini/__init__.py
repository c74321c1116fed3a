"""The Gemini API protocol (p3: ``google/…``, also ``gemini/…``): ``generateContent`` and
``streamGenerateContent?alt=sse`` on the Generative Language API. The request (:mod:`.request`), the
answer and error bodies (:mod:`.response`) and the stream (:mod:`.stream`), each pure translation
between OpenAI chat and Gemini's wire. Wire facts: docs/providers.md, Gemini.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.base import Adapter, Call, StreamTranslator, UpstreamRequest
from adapters.gemini.request import build
from adapters.gemini.response import finish_reason, parse, upstream_error, usage_from_gemini
from adapters.gemini.stream import GeminiStream
from core.errors import GatewayError
from core.wire import TokenUsage


class GeminiAdapter(Adapter):
    protocol = "gemini"

    def build_request(self, call: Call) -> UpstreamRequest:
        return build(call)

    def parse_response(self, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
        return parse(self.name, call, body)

    def stream(self, call: Call) -> StreamTranslator:
        return GeminiStream(self.name, call.request.n or 1)

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        return upstream_error(self.name, status, body, headers)


__all__ = ["GeminiAdapter", "GeminiStream", "finish_reason", "usage_from_gemini"]
