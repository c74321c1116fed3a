"""``POST /v1/chat/completions``: the main path of a request (design §3)."""

from __future__ import annotations

import secrets
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from adapters.base import Call
from billing.ledger import Meter
from billing.pricing import worst_case
from billing.store import UsageRecord
from router.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    PermissionDenied,
    UnsupportedMediaType,
)
from router.gateway import Gateway
from router.responses import SSE, JSONBytes
from router.stream import Shaper, relay
from router.wire import ChatRequest, parse_chat_request

_encode = msgspec.json.Encoder().encode


async def read_json_body(request: Request, limit: int) -> bytes:
    ctype = request.headers.get("content-type", "")
    if "json" not in ctype.lower():
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {ctype or 'none'!r}).", code="unsupported_content_type"
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        # answer at once and close: the rest of the body is never read
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.", headers={"Connection": "close"})
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.", headers={"Connection": "close"})
        chunks.append(chunk)
    return b"".join(chunks)


def _answer_text(data: dict) -> str:
    parts = []
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        for field in ("content", "reasoning_content"):
            if isinstance(message.get(field), str):
                parts.append(message[field])
    return "".join(parts)


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        if not gw.started:
            await gw.start()
        principal = await gw.auth.authenticate(request.headers.get("authorization"))
        body = await read_json_body(request, gw.settings.server.max_body_bytes)
        raw, req = parse_chat_request(body)
        model = gw.catalog.resolve(req.model)
        gw.catalog.require_endpoint(model, req.model, "chat")
        self._check(req, model.image_input)
        if principal.allowed_models is not None and not (
            model.id in principal.allowed_models or req.model in principal.allowed_models
        ):
            raise PermissionDenied(f"This API key is not allowed to use the model `{req.model}`.", param="model")
        stream = bool(req.stream)
        call = Call(
            model_id=req.model,
            model=model,
            provider=gw.providers[model.provider],
            raw=raw,
            request=req,
            stream=stream,
            include_usage=bool(stream and req.stream_options and req.stream_options.include_usage),
        )
        adapter = gw.adapter(model.provider)
        upstream = adapter.build_request(call)
        reservation = await gw.ledger.reserve(principal.group_id, principal.key_id, worst_case(model, len(body), req))
        record = UsageRecord(
            key_id=principal.key_id, group_id=principal.group_id, model=model.id, provider=model.provider,
            endpoint="chat", source=request.scope.get("state", {}).get("source", "api"), stream=stream,
            request_id=request.scope.get("state", {}).get("request_id"),
        )  # fmt: skip
        meter = Meter(gw.ledger, reservation, model, record, raw.get("messages"))
        try:
            response = await gw.transport.open(upstream, call.provider)
            upstream_id = response.headers.get("x-request-id") or response.headers.get("request-id")
            if response.status >= 400:
                try:
                    error_body = await response.read()
                finally:
                    response.release()
                raise adapter.error(response.status, error_body, response.headers)
            cid = completion_id()
            if stream:
                shaper = Shaper(call, cid, int(time.time()))
                return SSE(relay(call, adapter.stream(call), response, shaper, meter),
                           finalize=lambda: meter.finish(None, "interrupted"))  # fmt: skip
            try:
                payload = await response.read()
            finally:
                response.release()
            data, usage = adapter.parse_response(call, payload)
            data["id"] = cid
            data["object"] = "chat.completion"
            data["model"] = req.model
            if "usage" not in data and usage is not None:
                data["usage"] = usage.openai()
            await meter.finish(usage, "ok", generated="" if usage else _answer_text(data), upstream_id=upstream_id)
        except GatewayError as exc:
            await meter.finish(None, "error", error=exc.message)
            raise
        except BaseException:  # cancelled, or a bug: settle anyway (the reservation is released)
            await meter.finish(None, "interrupted", error="the call did not complete")
            raise
        return JSONBytes(_encode(data))

    def _check(self, req: ChatRequest, image_input: bool) -> None:
        if not image_input and req.has_images():
            raise InvalidRequest(
                f"The model `{req.model}` does not accept image input; send text only, or pick a model with "
                "image_input in GET /v1/models.",
                param="messages",
                code="image_input_unsupported",
            )
