"""``POST /v1/chat/completions``: HTTP in, the chat pipeline, HTTP out."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from billing.store import Principal
from router.errors import PayloadTooLarge, UnsupportedMediaType
from router.gateway import Gateway
from router.pipeline import ChatPipeline
from router.responses import SSE, JSONBytes
from router.stream import sse
from router.wire import parse_chat_request

_encode = msgspec.json.Encoder().encode


async def read_json_body(request: Request, limit: int) -> bytes:
    ctype = request.headers.get("content-type", "")
    if "json" not in ctype.lower():
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {ctype or 'none'!r}).", code="unsupported_content_type"
        )
    too_large = f"The request body is larger than the limit of {limit} bytes."
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        # answer at once and close: the rest of the body is never read
        raise PayloadTooLarge(too_large, headers={"Connection": "close"})
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(too_large, headers={"Connection": "close"})
        chunks.append(chunk)
    return b"".join(chunks)


async def principal_of(gw: Gateway, request: Request) -> Principal:
    """The caller: from the Authorization header, or set by an in-process caller (the batch runner),
    which no HTTP request can do."""
    state = request.scope.get("state") or {}
    given = state.get("principal")
    if isinstance(given, Principal):
        return given
    return await gw.auth.authenticate(request.headers.get("authorization"))


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = ChatPipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        if not gw.started:
            await gw.start()
        principal = await principal_of(gw, request)
        body = await read_json_body(request, gw.settings.server.max_body_bytes)
        raw, req = parse_chat_request(body)
        state = request.scope.get("state") or {}
        started = await self.pipeline.start(
            principal, raw, req, len(body), source=state.get("source", "api"), request_id=state.get("request_id")
        )
        if started.call.stream:
            return SSE(sse(self.pipeline.chunks(started)), finalize=lambda: self.pipeline.abandon(started))
        return JSONBytes(_encode(await self.pipeline.complete(started)))
