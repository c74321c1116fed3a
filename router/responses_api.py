"""``POST /v1/responses`` for every provider group (docs/architecture.md, the path of one call).

Group p1 (OpenAI) speaks the Responses API itself: the body goes through to ``{base_url}/responses``
(:mod:`adapters.openai_responses`), reserved before and settled after like a chat call, usage read from
the final response. Every other group is translated: Responses → chat request
(:mod:`gateway.responses_translate`) → the chat pipeline → a Response object, or, streamed, the event
sequence p1 emits (:mod:`gateway.responses_events`). Usage records say endpoint ``responses``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from adapters import openai_responses
from adapters.base import UpstreamRequest, map_upstream_error, upstream_request_id
from billing.ledger import Meter
from billing.pricing import worst_case
from billing.store import UsageRecord
from core.catalog import Model
from core.errors import GatewayError, InvalidRequest, UpstreamError
from core.inputs import decode_json
from core.sse import SSEDecoder, frame_event
from core.wire import ChatRequest, ImagePart, ImageURL, Message
from gateway.context import CallContext
from gateway.pipeline import ChatPipeline, Started
from gateway.reliability import REFUSED, circuit_open, open_upstream
from gateway.responses_events import EventSynth
from gateway.responses_translate import (
    estimate_prompt,
    from_completion,
    image_urls,
    refuse_background,
    shell,
    to_chat,
)
from gateway.state import Gateway
from gateway.stream import StreamEnd
from router.chat import begin_call
from router.replies import SSE, JSONBytes

SAMPLING = frozenset({"temperature", "top_p", "top_logprobs"})  # the Responses API's sampling options
NO_POLL = (
    "this gateway does not offer GET /v1/responses/{id}, so a background response could never be polled "
    "(nor billed); omit 'background', or use 'stream: true' for a long answer"
)

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Ask:
    """One Responses call as it arrived."""

    context: CallContext
    body: dict[str, Any]
    size: int  # bytes of the body (bounds the prompt's tokens for the reservation)

    @property
    def model_id(self) -> str:
        return str(self.body["model"])

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


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
    return body


def reserve_request(body: dict[str, Any]) -> ChatRequest:
    """The chat-shaped view of a Responses call that the worst-case reservation and checks take."""
    urls = image_urls(body)
    parts: list[Any] = [ImagePart(image_url=ImageURL(url=url)) for url in urls]
    cap = body.get("max_output_tokens")
    return ChatRequest(
        model=str(body["model"]),
        messages=[Message(role="user", content=parts)] if parts else [],
        max_completion_tokens=cap if isinstance(cap, int) and cap > 0 else None,
    )


def chat_request(chat: dict[str, Any]) -> ChatRequest:
    try:
        return msgspec.convert(chat, ChatRequest)
    except msgspec.ValidationError as exc:
        text = str(exc)
        path = text.rpartition(" - at `$.")[2].rstrip("`") if " - at `$." in text else ""
        field = path.split("[", 1)[0].split(".", 1)[0]
        param = {"max_tokens": "max_output_tokens", "messages": "input"}.get(field, field) or None
        message = text.partition(" - at `")[0]
        raise InvalidRequest(
            f"Invalid value for '{param}': {message}." if param else f"Invalid request: {message}.",
            param=param,
            code="invalid_value",
        ) from None


def frames(events: list[dict[str, Any]]) -> bytes:
    return b"".join([frame_event(event["type"], _encode(event)) for event in events])


class Responses:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = ChatPipeline(gateway)

    async def handle(self, request: Request) -> Response:
        context, trace, raw = await begin_call(self.gw, request, "responses")
        ask = Ask(context, parse_body(raw), len(raw))
        trace.model = ask.model_id
        model = self.check(ask)
        trace.provider = model.provider
        if self.gw.catalog.providers[model.provider].responses_api:
            return await self.native(ask, model)
        return await self.translated(ask)

    def check(self, ask: Ask) -> Model:
        """Model, endpoint, image input and key permission, before anything is reserved or sent."""
        model = self.gw.catalog.resolve(ask.model_id)
        self.gw.catalog.require_endpoint(model, ask.model_id, "responses")
        if not model.image_input and image_urls(ask.body):
            raise InvalidRequest(
                f"The model `{ask.model_id}` does not accept image input; send text only, or pick a model with "
                "image_input in GET /v1/models.",
                param="input",
                code="image_input_unsupported",
            )
        try:
            return self.pipeline.check(ask.context.principal, reserve_request(ask.body), "responses")
        except InvalidRequest as exc:
            if exc.param not in ("max_tokens", "max_completion_tokens"):
                raise
            message = exc.message.replace(exc.param, "max_output_tokens")  # our name for the chat field
            raise InvalidRequest(message, param="max_output_tokens", code=exc.code) from None

    # -- every other group: translated through the chat pipeline ---------------------------------
    async def translated(self, ask: Ask) -> Response:
        chat = to_chat(ask.body)
        started = await self.pipeline.start(ask.context, chat, chat_request(chat), ask.size)
        response = shell(ask.body, ask.model_id)
        if started.call.stream:
            return SSE(
                self.synthesise(started, EventSynth(response)),
                started.rate_headers,
                finalize=lambda: self.pipeline.abandon(started),
            )
        return JSONBytes(
            _encode(from_completion(await self.pipeline.complete(started), response)), extra=started.rate_headers
        )

    async def synthesise(self, started: Started, synth: EventSynth) -> AsyncGenerator[bytes, None]:
        batches = self.pipeline.chunks(started)
        try:
            yield frames(synth.start())
            async for batch in batches:
                events = [event for chunk in batch for event in synth.feed(chunk)]
                if events:
                    yield frames(events)
            tail = synth.finish()
            if tail:
                yield frames(tail)
        finally:
            await batches.aclose()

    # -- group p1: pass-through -------------------------------------------------------------------
    async def native(self, ask: Ask, model: Model) -> Response:
        refuse_background(ask.body, NO_POLL)  # before anything is reserved or sent
        provider = self.gw.providers[model.provider]
        # rate limits as for chat calls: checked once, before anything is reserved or sent
        limits = await self.gw.limits.admit(ask.context.principal, model, ask.size, reserve_request(ask.body))
        breaker = self.gw.breakers[model.provider]
        ticket = breaker.allow()
        if ticket == REFUSED:
            raise circuit_open(model.provider)
        try:
            meter = await self.meter(ask, model)
            body = ask.body
            if model.reasoning:  # sampling options a reasoning model refuses (catalog data, as for chat)
                drop = SAMPLING.intersection(self.gw.catalog.providers[model.provider].reasoning_drop_fields)
                body = {name: value for name, value in body.items() if name not in drop}
            response = await self.open(openai_responses.build_request(provider, body, model.upstream), model, meter)
        finally:  # a probe that ended without a verdict on the provider (402, 4xx, a hang-up): let it go
            if ticket:
                breaker.release(ticket)
        if not ask.stream:
            return JSONBytes(_encode(await self.read(ask, model, response, meter)), extra=limits)
        relay = openai_responses.ResponsesRelay(ask.model_id, model.provider)

        async def abandon() -> None:
            response.close()
            await meter.finish(None, "interrupted", generated=relay.generated_text())

        return SSE(relay_stream(relay, response, meter), limits, finalize=abandon)

    async def meter(self, ask: Ask, model: Model) -> Meter:
        gw, who = self.gw, ask.context
        reservation = await gw.ledger.reserve(
            who.group_id, who.key_id, worst_case(model, ask.size, reserve_request(ask.body))
        )
        record = UsageRecord(
            key_id=who.key_id,
            group_id=who.group_id,
            model=model.id,
            provider=model.provider,
            endpoint=who.endpoint,
            source=who.source,
            stream=ask.stream,
            request_id=who.request_id,
        )
        return Meter(gw.ledger, reservation, model, record, estimate_prompt(ask.body))

    async def open(self, upstream: UpstreamRequest, model: Model, meter: Meter) -> aiohttp.ClientResponse:
        """The upstream's response, with the same retries and circuit breaker as chat calls."""
        deadline = time.monotonic() + self.gw.settings.reliability.deadline
        async with meter.settles_on_failure():
            return await open_upstream(
                self.gw, upstream, model.provider, partial(map_upstream_error, model.provider), deadline
            )

    async def read(
        self, ask: Ask, model: Model, response: aiohttp.ClientResponse, meter: Meter
    ) -> dict[str, Any]:
        async with meter.settles_on_failure():
            try:
                payload = await response.read()
            finally:
                response.release()
            data, usage = openai_responses.parse_response(payload, ask.model_id, model.provider)
            error = data.get("error") if data.get("status") == "failed" else None
            message = str(error.get("message")) if isinstance(error, dict) else None
            await meter.finish(
                usage,
                "error" if message else "ok",
                generated="" if usage else openai_responses.output_text(data),
                error=message,
                upstream_id=upstream_request_id(response.headers),
            )
            return data


async def relay_stream(
    relay: openai_responses.ResponsesRelay, response: aiohttp.ClientResponse, meter: Meter
) -> AsyncGenerator[bytes, None]:
    """The upstream's events to the caller as they come; a stream that breaks off ends with a
    synthesised ``response.failed``. Settled exactly once, however the stream ends."""
    decoder = SSEDecoder()
    outcome = StreamEnd()
    out: list[bytes] = []
    tail = b""
    try:
        try:
            async for data in response.content.iter_any():
                for event in decoder.feed(data):
                    out += relay.feed(event)
                if out:
                    if outcome.first_token_at is None:
                        outcome.first_token_at = time.monotonic()
                    yield b"".join(out)
                    out = []
                if relay.finished:
                    break
            else:
                for event in decoder.close():
                    out += relay.feed(event)
            if not relay.finished:
                raise UpstreamError(
                    f"The provider '{relay.provider}' ended the stream before the response was complete."
                )
        except GatewayError as exc:
            tail = relay.fail(exc.message)
        except (TimeoutError, aiohttp.ClientError) as exc:
            tail = relay.fail(
                f"The connection to the provider '{relay.provider}' was lost mid-stream ({type(exc).__name__})."
            )
        if relay.error is not None:
            outcome.status, outcome.error = "error", relay.error
        await outcome.settle(meter, relay.usage, relay.generated_text(), response)
        if out or tail:
            yield b"".join(out) + tail
    except (GeneratorExit, asyncio.CancelledError):
        outcome.status = "interrupted"
        raise
    finally:
        if outcome.status != "ok" or tail:
            response.close()  # drop the connection: the rest of the upstream stream is not read
        else:
            response.release()
        await outcome.settle(meter, relay.usage, relay.generated_text(), response)
