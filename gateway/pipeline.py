"""The path of one chat call, without HTTP (docs/architecture.md, the path of one call): the chat endpoint, the Responses endpoint for
translated providers and the batch runner all go through it.

    start(context, raw, request)     resolve the model, check capabilities and permissions, reserve the
                                     worst case (402), open the upstream; any failure is settled at once
    complete(started)                non-stream: the OpenAI chat.completion dict, settled
    chunks(started)                  stream: batches of OpenAI chunk dicts, settled exactly once
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.base import Adapter, Call, upstream_request_id
from billing.ledger import Meter
from billing.pricing import worst_case
from billing.store import Principal, UsageRecord
from core.catalog import Model
from core.errors import GatewayError, InvalidRequest, PermissionDenied, UpstreamUnavailable
from core.types import Endpoint, Headers, new_id
from core.wire import ChatRequest
from gateway.auth import may_use
from gateway.context import CallContext
from gateway.reliability import REFUSED, circuit_open, failover, open_upstream
from gateway.state import Gateway
from gateway.stream import Shaper, chunks


@dataclass(slots=True)
class Started:
    call: Call
    adapter: Adapter
    meter: Meter
    response: aiohttp.ClientResponse
    completion_id: str
    upstream_id: str | None
    rate_headers: Headers | None = None  # x-ratelimit-* for the HTTP response (gateway/ratelimit.py)


_HEAD = frozenset({"id", "object", "created", "model", "choices", "usage"})


def completion_id() -> str:
    return "chatcmpl-" + new_id()


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

    def check(self, principal: Principal, req: ChatRequest, endpoint: Endpoint = "chat",
              model_id: str | None = None) -> Model:  # fmt: skip
        gw = self.gw
        model_id = model_id or req.model
        model = gw.catalog.resolve(model_id)
        gw.catalog.require_endpoint(model, model_id, endpoint)
        if not model.image_input and req.has_images():
            raise InvalidRequest(
                f"The model `{model_id}` does not accept image input; send text only, or pick a model with "
                "image_input in GET /v1/models.",
                param="messages",
                code="image_input_unsupported",
            )
        custom = req.custom_tools_at()
        if custom and not gw.catalog.providers[model.provider].custom_tools:  # they pass through, untranslated
            raise InvalidRequest(
                f"Custom tools ('type': 'custom') are supported only by OpenAI models (openai/...); the model "
                f"`{model_id}` takes function tools ('type': 'function').",
                param=custom,
                code="unsupported_tool",
            )
        if not may_use(principal, model.id, model_id):
            raise PermissionDenied(f"This API key is not allowed to use the model `{model_id}`.", param="model")
        if req.output_cap is not None and model.max_output and req.output_cap > model.max_output:
            raise InvalidRequest(
                f"max_tokens is too large: {req.output_cap}. The model `{model_id}` produces at most "
                f"{model.max_output} output tokens.",
                param="max_tokens",
                code="invalid_value",
            )
        return model

    def candidates(self, raw: dict[str, Any], req: ChatRequest) -> list[str]:
        """The models to try in order: the one asked for, the request's own ``models`` list (as
        OpenRouter accepts it), then the catalog's fallbacks of the first."""
        ids = [req.model]
        extra = raw.pop("models", None)
        raw.pop("route", None)
        if extra is not None:
            if not isinstance(extra, list) or not all(isinstance(m, str) for m in extra) or len(extra) > 8:
                raise InvalidRequest("'models' must be a list of at most 8 model ids.", param="models")
            ids += extra
        ids += self.gw.catalog.resolve(req.model).fallbacks
        return list(dict.fromkeys(ids))

    async def start(self, context: CallContext, raw: dict[str, Any], req: ChatRequest, body_size: int) -> Started:
        """Try each candidate model in turn (retrying each as the reliability settings say) until one
        upstream answers; the caller is billed at the prices of the model that served."""
        gw = self.gw
        principal, endpoint = context.principal, context.endpoint
        deadline = time.monotonic() + gw.settings.reliability.deadline
        ids = self.candidates(raw, req)
        last: GatewayError | None = None
        limit_headers: Headers | None = None
        for n, model_id in enumerate(ids):
            try:
                model = self.check(principal, req, endpoint, model_id)
            except GatewayError:
                if n == 0:
                    raise
                continue  # a fallback this call cannot use
            if n == 0:  # rate limits: once per call (429 here is final: no fallback), before any reserve
                limit_headers = await gw.limits.admit(principal, model, body_size, req)
            breaker = gw.breakers[model.provider]
            ticket = breaker.allow()
            if ticket == REFUSED:
                last = circuit_open(model.provider)
                continue
            attempt = _Attempt(self, context, raw, req, body_size, model, model_id, deadline)
            try:
                started = await attempt.run()
                started.rate_headers = limit_headers
                return started
            except GatewayError as exc:
                if not failover(exc) or n == len(ids) - 1 or time.monotonic() >= deadline:
                    raise
                last = exc
            finally:  # a probe that ended without a verdict on the provider (402, 4xx, a hang-up): let it go
                if ticket:
                    breaker.release(ticket)
        raise last or UpstreamUnavailable("No upstream could serve this call.")

    async def complete(self, started: Started) -> dict[str, Any]:
        call, meter, response = started.call, started.meter, started.response
        async with meter.settles_on_failure():
            try:
                payload = await response.read()
            finally:
                response.release()
            data, usage = started.adapter.parse_response(call, payload)
            data = {  # the same key order whatever the provider
                "id": started.completion_id,
                "object": "chat.completion",
                "created": data.get("created") or int(time.time()),
                "model": call.model_id,
                "choices": data["choices"],
                "usage": data.get("usage") or (usage.openai() if usage is not None else None),
                **{k: v for k, v in data.items() if k not in _HEAD},
            }
            generated = "" if usage else _answer_text(data)
            await meter.finish(usage, "ok", generated=generated, upstream_id=started.upstream_id)
            return data

    def chunks(self, started: Started, raw: bool = False) -> AsyncGenerator[list[Any], None]:
        """The stream's batches of chunks (gateway/stream.py ``chunks``; ``raw``: some may be
        their JSON already, as ``bytes``, for a consumer that only encodes them)."""
        shaper = Shaper(started.call, started.completion_id, int(time.time()))
        translator = started.adapter.stream(started.call)
        return chunks(started.call, translator, started.response, shaper, started.meter, raw)

    async def abandon(self, started: Started) -> None:
        """The consumer went away before or while reading: close the upstream, settle (no-op if done)."""
        started.response.close()
        await started.meter.finish(None, "interrupted")


@dataclass(slots=True)
class _Attempt:
    """One candidate model: reserve at its prices, open its upstream with retries, settle on failure."""

    pipeline: ChatPipeline
    context: CallContext
    raw: dict[str, Any]
    req: ChatRequest
    body_size: int
    model: Model
    model_id: str
    deadline: float

    async def run(self) -> Started:
        gw = self.pipeline.gw
        req, model, context = self.req, self.model, self.context
        stream = bool(req.stream)
        call = Call(
            model_id=self.model_id,
            model=model,
            provider=gw.providers[model.provider],
            raw=self.raw,
            request=req,
            stream=stream,
            include_usage=bool(stream and req.stream_options and req.stream_options.include_usage),
        )
        adapter = gw.adapters[model.provider]
        upstream = adapter.build_request(call)
        # (rate limits were checked once per call, in start(), before the first attempt)
        reservation = await gw.ledger.reserve(
            context.group_id, context.key_id, worst_case(model, self.body_size, req, upstream.max_output)
        )
        record = UsageRecord(
            key_id=context.key_id, group_id=context.group_id, model=model.id, provider=model.provider,
            endpoint=context.endpoint, source=context.source, stream=stream, request_id=context.request_id,
        )  # fmt: skip
        meter = Meter(gw.ledger, reservation, model, record, self.raw)
        async with meter.settles_on_failure():
            response = await open_upstream(gw, upstream, model.provider, adapter.error, self.deadline)
            return Started(call, adapter, meter, response, completion_id(), upstream_request_id(response.headers))
