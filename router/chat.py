"""``POST /v1/chat/completions``: HTTP in, the chat pipeline, HTTP out."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from billing.store import Principal
from core.deadlines import Deadlines
from core.errors import GatewayError, PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from core.inputs import natural
from core.types import Endpoint
from core.wire import parse_chat_request
from gateway.chat_codec import ChatCodec
from gateway.context import CONTEXT, CallContext, identify
from gateway.pipeline import Pipeline, Started
from gateway.state import Gateway
from gateway.stream import sse
from router.dialects import CHAT, events_of
from router.logs import Trace, trace_of
from router.replies import JSONBytes, LateSSE

_encode = msgspec.json.Encoder().encode


async def read_body(
    request: Request,
    limit: int,
    seconds: float,
    deadlines: Deadlines,
    *,
    too_large: str,
    code: str | None = None,
    what: str = "request body",
) -> bytes:
    """The whole body, at most ``limit`` bytes (413, and the connection closed: the rest is never read)
    within ``seconds`` (408). Read from the ASGI ``receive`` itself, not ``Request.stream()``."""
    length = request.headers.get("content-length")
    if length is not None and (natural(length) or 0) > limit:
        raise PayloadTooLarge(too_large, code=code, headers={"Connection": "close"})
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    try:
        with deadlines.after(seconds):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(too_large, code=code, headers={"Connection": "close"})
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestTimeout(
            f"The {what} did not arrive within {seconds:g} s.", headers={"Connection": "close"}
        ) from None
    trace_of(request.scope).body_read = True
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_json_body(request: Request, limit: int, seconds: float, deadlines: Deadlines) -> bytes:
    ctype = request.headers.get("content-type", "")
    if "json" not in ctype.lower():
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {ctype or 'none'!r}).",
            code="unsupported_content_type",
        )
    too_large = f"The request body is larger than the limit of {limit} bytes."
    return await read_body(request, limit, seconds, deadlines, too_large=too_large)


def given_context(request: Request) -> CallContext | None:
    """The context an in-process caller (the batch runner) put in the request's state, which no HTTP
    request can do."""
    given = (request.scope.get("state") or {}).get(CONTEXT)
    return given if isinstance(given, CallContext) else None


async def principal_of(gw: Gateway, request: Request) -> Principal:
    """The caller: from the Authorization header, or from an in-process caller's context."""
    given = given_context(request)
    if given is not None:
        return given.principal
    return await gw.auth.authenticate(request.headers.get("authorization"))


async def begin_call(
    gw: Gateway, request: Request, endpoint: Endpoint, json: bool = True, authorization: str | None = None
) -> tuple[CallContext, Trace, bytes]:
    """The start of a model call endpoint: the gateway started, the caller authenticated (and noted
    in the request's trace for the access log: the key's id and group, never the key), the JSON body
    read (JSON unless ``json`` is false). ``authorization``: the key as an Authorization header, when
    the endpoint takes it elsewhere too (else the request's own header). Returns the call's context,
    the request's trace and the body."""
    if not gw.started:
        await gw.start()
    trace = trace_of(request.scope)
    context = given_context(request)
    if context is None:
        principal = await gw.auth.authenticate(authorization or request.headers.get("authorization"))
        context = CallContext(principal, trace.request_id or None, "api", endpoint)
        context.traceparent = request.headers.get("traceparent")
    context.key_prefix = gw.settings.server.key_prefix  # (who the call is for is read with it: identify)
    trace.caller = context.principal
    trace.context = context
    limit, seconds = gw.settings.server.max_body_bytes, gw.settings.reliability.body_timeout
    if json:
        body = await read_json_body(request, limit, seconds, gw.deadlines)
    else:  # multipart (images/edits): its own parser checks the type
        body = await read_body(
            request,
            limit,
            seconds,
            gw.deadlines,
            too_large=f"The request body is larger than the limit of {limit} bytes.",
        )
    return context, trace, body


Encoder = Callable[[AsyncGenerator[list[Any], None]], AsyncGenerator[bytes, None]]


async def answered(pipeline: Pipeline, start: Awaitable[Started], trace: Trace) -> Response:
    """A non-stream call's answer for any endpoint, once its upstream answered, settled."""
    started = await start
    trace.served(started.model.provider, started.deployment)  # for the access log
    answer = await pipeline.complete(started)
    extra = started.rate_headers
    if answer.cost is not None:
        extra = [*(extra or ()), (b"x-request-cost", answer.cost.encode())]
    return JSONBytes(_encode(answer.body), extra=extra)


async def streamed(
    pipeline: Pipeline, start: Awaitable[Started], trace: Trace, encode: Encoder
) -> AsyncGenerator[Any, None]:
    """The body of a :class:`LateSSE` for any endpoint: first the headers for the response start
    (once the upstream answered), then the stream's bytes (``encode`` of the relayed pieces).
    Whatever ends it, a call that started is let go of (settled)."""
    started = await start
    trace.served(started.model.provider, started.deployment)  # for the access log
    try:
        yield started.rate_headers or []
        inner = encode(pipeline.relay(started))
        try:
            async for piece in inner:
                yield piece
        finally:
            await inner.aclose()
    finally:
        await pipeline.abandon(started)  # (nothing to do if the stream was settled)


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        context, trace, body = await begin_call(gw, request, "chat")
        raw, req = parse_chat_request(body)
        trace.model, trace.stream = req.model, bool(req.stream)
        identify(context, raw)
        codec = ChatCodec(raw, req, len(body), encode_only=True)
        start = self.pipeline.start(context, codec)
        if not codec.stream:
            return await answered(self.pipeline, start, trace)
        # A stream whose upstream is slow to answer (retries, fallbacks, a slow first byte) starts at
        # once with SSE keep-alive comments; until then an error is still a plain HTTP error.
        stream = streamed(self.pipeline, start, trace, sse)
        return LateSSE(stream, gw.settings.reliability.stream_keepalive, events_of(CHAT))


def record_refusal(gw: Gateway, trace: Trace, exc: GatewayError) -> None:
    """A model call refused before anything was reserved for it (a bad body, a model it may not use,
    a rate limit, too few credits, an open circuit) still leaves a usage record: status ``rejected``,
    no credits, the error's code; past 10 a second per group and code, one in a while, saying how many
    it stands for (gateway/refusals.py). Calls whose caller is unknown (401) have no group to record
    it in."""
    context = trace.context
    if context is None or context.metered:
        return
    more = gw.refusals.keep(context.group_id, exc.code or exc.type, time.monotonic())
    if more is None:  # a flood of them: counted, not each recorded (gateway/refusals.py)
        return
    asked = trace.model or ""
    try:
        model = gw.catalog.resolve(asked)
        name, provider = model.id, model.provider
    except GatewayError:
        name, provider = asked, ""
    record = context.rejected(exc, name, provider, trace.stream, trace.began)
    if more:
        record.error = (
            f"{record.error} (and {more} more refused alike in this group since, not recorded one by one)"
        )
    gw.ledger.record(record)
