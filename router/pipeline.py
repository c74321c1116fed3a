"""The path of one chat call, without HTTP (design §3): the chat endpoint, the Responses endpoint for
translated providers and the batch runner all go through it.

    start(principal, raw, request)   resolve the model, check capabilities and permissions, reserve the
                                     worst case (402), open the upstream; any failure is settled at once
    complete(started)                non-stream: the OpenAI chat.completion dict, settled
    chunks(started)                  stream: batches of OpenAI chunk dicts, settled exactly once
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.base import Adapter, Call
from billing.ledger import Meter
from billing.pricing import worst_case
from billing.store import Principal, UsageRecord
from router.errors import GatewayError, InvalidRequest, PermissionDenied
from router.gateway import Gateway
from router.stream import Shaper, chunks
from router.wire import ChatRequest


@dataclass(slots=True)
class Started:
    call: Call
    adapter: Adapter
    meter: Meter
    response: aiohttp.ClientResponse
    completion_id: str
    upstream_id: str | None


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def _answer_text(data: dict[str, Any]) -> str:
    parts = []
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        for field in ("content", "reasoning_content"):
            if isinstance(message.get(field), str):
                parts.append(message[field])
    return "".join(parts)


class ChatPipeline:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def check(self, principal: Principal, req: ChatRequest, endpoint: str = "chat") -> Any:
        gw = self.gw
        model = gw.catalog.resolve(req.model)
        gw.catalog.require_endpoint(model, req.model, endpoint)
        if not model.image_input and req.has_images():
            raise InvalidRequest(
                f"The model `{req.model}` does not accept image input; send text only, or pick a model with "
                "image_input in GET /v1/models.",
                param="messages",
                code="image_input_unsupported",
            )
        if principal.allowed_models is not None and not (
            model.id in principal.allowed_models or req.model in principal.allowed_models
        ):
            raise PermissionDenied(f"This API key is not allowed to use the model `{req.model}`.", param="model")
        return model

    async def start(self, principal: Principal, raw: dict[str, Any], req: ChatRequest, body_size: int, *,
                    source: str = "api", endpoint: str = "chat", request_id: str | None = None) -> Started:  # fmt: skip
        gw = self.gw
        model = self.check(principal, req, endpoint)
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
        reservation = await gw.ledger.reserve(principal.group_id, principal.key_id, worst_case(model, body_size, req))
        record = UsageRecord(
            key_id=principal.key_id, group_id=principal.group_id, model=model.id, provider=model.provider,
            endpoint=endpoint, source=source, stream=stream, request_id=request_id,
        )  # fmt: skip
        meter = Meter(gw.ledger, reservation, model, record, raw.get("messages"))
        try:
            response = await gw.transport.open(upstream, call.provider)
            if response.status >= 400:
                try:
                    error_body = await response.read()
                finally:
                    response.release()
                raise adapter.error(response.status, error_body, response.headers)
        except GatewayError as exc:
            await meter.finish(None, "error", error=exc.message)
            raise
        except BaseException:  # cancelled, or a bug: settle anyway (the reservation is released)
            await meter.finish(None, "interrupted", error="the call did not complete")
            raise
        upstream_id = response.headers.get("x-request-id") or response.headers.get("request-id")
        return Started(call, adapter, meter, response, completion_id(), upstream_id)

    async def complete(self, started: Started) -> dict[str, Any]:
        call, meter, response = started.call, started.meter, started.response
        try:
            try:
                payload = await response.read()
            finally:
                response.release()
            data, usage = started.adapter.parse_response(call, payload)
            data["id"] = started.completion_id
            data["object"] = "chat.completion"
            data["model"] = call.model_id
            if "usage" not in data and usage is not None:
                data["usage"] = usage.openai()
            generated = "" if usage else _answer_text(data)
            await meter.finish(usage, "ok", generated=generated, upstream_id=started.upstream_id)
            return data
        except GatewayError as exc:
            await meter.finish(None, "error", error=exc.message)
            raise
        except BaseException:
            await meter.finish(None, "interrupted", error="the call did not complete")
            raise

    def chunks(self, started: Started) -> AsyncGenerator[list[dict[str, Any]], None]:
        shaper = Shaper(started.call, started.completion_id, int(time.time()))
        return chunks(started.call, started.adapter.stream(started.call), started.response, shaper, started.meter)

    async def abandon(self, started: Started) -> None:
        """The consumer went away before or while reading: close the upstream, settle (no-op if done)."""
        started.response.close()
        await started.meter.finish(None, "interrupted")
