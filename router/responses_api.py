"""``POST /v1/responses`` for every provider group: HTTP in, the pipeline with the Responses codec
(gateway/responses_codec.py: native pass-through for a provider that speaks the Responses API,
translated through chat for the others), HTTP out. Usage records say endpoint ``responses``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from core.errors import GatewayError, InvalidRequest
from core.inputs import decode_json
from core.sse import frame_event
from gateway.context import identify
from gateway.pipeline import Pipeline
from gateway.responses_codec import ResponsesCodec, Terminal
from gateway.responses_translate import refuse_background
from gateway.state import Gateway
from router.chat import answered, begin_call, streamed
from router.replies import LateSSE

NO_POLL = (
    "this gateway does not offer GET /v1/responses/{id}, so a background response could never be polled "
    "(nor billed); omit 'background', or use 'stream: true' for a long answer"
)

_encode = msgspec.json.Encoder().encode


def parse_body(raw: bytes) -> dict[str, Any]:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    if body.get("stream") not in (None, True, False):
        raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
    if "input" in body and not isinstance(body["input"], (str, list)):
        raise InvalidRequest("Invalid type for 'input': expected a string or an array of input items.",
                             param="input", code="invalid_type")  # fmt: skip
    return body


async def events(batches: AsyncGenerator[list[Any], None]) -> AsyncGenerator[bytes, None]:
    """A Responses stream's pieces as SSE bytes (its terminal event framed last)."""
    try:
        async for batch in batches:
            yield b"".join([piece.frame() if piece.__class__ is Terminal else piece for piece in batch])
    finally:
        await batches.aclose()


def _error_event(exc: GatewayError) -> bytes:
    """A failure after keep-alives went out, before the upstream answered: the API's ``error`` event."""
    event = {"type": "error", "code": exc.code, "message": exc.message, "param": exc.param, "sequence_number": 0}
    return frame_event("error", _encode(event))


class Responses:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        context, trace, raw = await begin_call(gw, request, "responses")
        body = parse_body(raw)
        trace.model, trace.stream = body["model"], bool(body.get("stream"))
        identify(context, body)
        refuse_background(body, NO_POLL)  # before anything is reserved or sent
        codec = ResponsesCodec(body, len(raw))
        start = self.pipeline.start(context, codec)
        if not codec.stream:
            return await answered(self.pipeline, start, trace)
        stream = streamed(self.pipeline, start, trace, events)
        return LateSSE(stream, gw.settings.reliability.stream_keepalive, _error_event)
