"""The life of one model call, without HTTP, for every endpoint (chat, Responses native or
translated, and through them batch lines and background responses). What differs between endpoints
and wire protocols is a codec's (gateway/codec.py); the stages are here, once:

    start(context, codec)    for each candidate model (the one asked for, the request's ``models``,
                             the catalog's fallbacks): resolve and check it, calls in flight and
                             rate limits (once per call), skip it if every deployment's circuit is
                             open, reserve the worst case (402), open the upstream on one of the
                             provider's deployments, moving between them and retrying
                             (gateway/dispatch.py); a failure is settled at once and the next
                             candidate tried if a fallback may help
    complete(started)        non-stream: the caller's answer, settled
    relay(started)           stream: batches of the caller's pieces, settled exactly once
    abandon(started)         the consumer went away before reading: settled as interrupted
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from adapters.base import UpstreamRequest, upstream_request_id
from billing.ledger import Meter
from billing.pricing import input_ceiling, output_ceiling, worst_case
from billing.store import Hold, Principal
from core.catalog import Model
from core.deployments import Deployment
from core.errors import (
    GatewayError,
    InvalidRequest,
    PermissionDenied,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from core.types import Endpoint, Headers
from core.wire import ChatRequest
from gateway.auth import may_use
from gateway.codec import Answer, Codec, Leg, cost_of
from gateway.concurrency import Flight
from gateway.context import CallContext
from gateway.relay import relay
from gateway.reliability import UpstreamCall, circuit_open, closed, failover, no_deployment, open_upstream
from gateway.routing import Ask
from gateway.state import Gateway
from gateway.tracing import current as traced
from gateway.tracing import finish_reasons
from gateway.upstream_state import Lease


@dataclass(slots=True)
class Started:
    """A call whose upstream answered: the leg that serves it, its meter, the open response."""

    leg: Leg
    meter: Meter
    response: aiohttp.ClientResponse
    upstream_id: str | None
    lease: Lease  # the call's hold on the deployment that answered, ended with it (gateway/upstream_state.py)
    rate_headers: Headers | None = None  # x-ratelimit-* for the HTTP response (gateway/ratelimit.py)

    @property
    def deployment(self) -> str:
        """The name of the provider's deployment that answered."""
        return self.lease.deployment.name

    @property
    def model(self) -> Model:
        return self.leg.model


class Pipeline:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def check(
        self,
        principal: Principal,
        req: ChatRequest,
        endpoint: Endpoint = "chat",
        model_id: str | None = None,
        *,
        image_param: str = "messages",
        cap_param: str = "max_tokens",
        clamp: bool = False,
    ) -> Model:
        """The model ``model_id`` (default: the request's) for this caller and request: its endpoint,
        image input, tools, custom tools, the key's allow-list, the output cap (400/403/404; ``clamp``:
        a cap over the model's ceiling is the codec's to lower)."""
        gw = self.gw
        model_id = model_id or req.model
        model = gw.catalog.resolve(model_id, principal.group_name)
        gw.catalog.require_endpoint(model, model_id, endpoint)
        if not model.image_input and req.has_images():
            raise InvalidRequest(
                f"The model `{model_id}` does not accept image input; send text only, or pick a model with "
                "image_input in GET /v1/models.",
                param=image_param,
                code="image_input_unsupported",
            )
        if req.tools and not model.tools:
            raise InvalidRequest(
                f"The model `{model_id}` does not support tools (function calling); send the request without "
                "'tools', or pick a model with tools in GET /v1/models.",
                param="tools",
                code="tools_unsupported",
            )
        custom = req.custom_tools_at()
        # they pass through, untranslated
        if custom and not gw.catalog.providers[model.provider].custom_tools:
            raise InvalidRequest(
                f"Custom tools ('type': 'custom') are supported only by OpenAI models (openai/...); the model "
                f"`{model_id}` takes function tools ('type': 'function').",
                param=custom,
                code="unsupported_tool",
            )
        if not may_use(principal, model.id, model_id):
            raise PermissionDenied(
                f"This API key is not allowed to use the model `{model_id}`.", param="model"
            )
        if (
            req.output_cap is not None
            and model.max_output
            and req.output_cap > model.max_output
            and not clamp
        ):
            raise InvalidRequest(
                f"{cap_param} is too large: {req.output_cap}. The model `{model_id}` produces at most "
                f"{model.max_output} output tokens.",
                param=cap_param,
                code="invalid_value",
            )
        return model

    def candidates(self, codec: Codec, group: str) -> list[str]:
        """The models to try in order: the one asked for, the request's own ``models`` list (as
        OpenRouter accepts it), then the catalog's fallbacks of the first."""
        first = codec.view.model
        return list(dict.fromkeys([first, *codec.models, *self.gw.catalog.resolve(first, group).fallbacks]))

    async def start(self, context: CallContext, codec: Codec) -> Started:
        """Try each candidate model in turn (retrying each as the reliability settings say) until one
        upstream answers; the caller is billed at the prices of the model that served. Traced when
        tracing is on (gateway/tracing.py: the call's span ends with its record, or here if refused)."""
        tracing = self.gw.tracing
        if tracing is None:
            return await self._start(context, codec)
        call = tracing.call(context, codec.view.model, codec.stream)
        try:
            return await self._start(context, codec)
        except BaseException as exc:
            call.failed(exc)  # (a call that reserved has ended with its record already)
            raise

    async def _start(self, context: CallContext, codec: Codec) -> Started:
        gw = self.gw
        principal = context.principal
        deadline = time.monotonic() + gw.settings.reliability.deadline
        ids = self.candidates(codec, principal.group_name)
        last: GatewayError | None = None
        limit_headers: Headers | None = None
        # its places, given back when it ends: its group's fair share of this process's calls in flight
        # (gateway/fairshare.py), the key's and group's calls in flight (gateway/concurrency.py)
        places: list[Flight] = []
        try:
            for n, model_id in enumerate(ids):
                try:
                    model = self.check(
                        principal,
                        codec.view,
                        codec.endpoint,
                        model_id,
                        image_param=codec.image_param,
                        cap_param=codec.cap_param,
                        clamp=codec.clamp_cap,
                    )
                    deployments = codec.deployments(gw, model)
                    if not deployments:
                        raise no_deployment(model)
                    leg = codec.leg(gw, model, model_id, deployments[0])
                except GatewayError:
                    if n == 0:
                        raise
                    continue  # a fallback this call cannot use
                if n == 0:  # limits: once per call (429 here is final: no fallback), before any reserve
                    if context.waited_on and (
                        share := gw.fair.enter(principal.group_id, principal.group_name)
                    ):
                        places.append(share)
                    entering = (
                        gw.in_flight.enter(principal) if gw.in_flight.enabled and context.waited_on else None
                    )
                    if entering is None:
                        limit_headers = await gw.limits.admit(principal, model, codec.size, codec.view)
                    else:  # (with Redis, the two checks go in one round trip)
                        try:
                            limit_headers = await gw.limits.admit(principal, model, codec.size, codec.view)
                        finally:
                            if flight := await entering:
                                places.append(flight)
                # every circuit open: nothing reserved for it
                if not closed(gw.breakers, deployments, context.group_id):
                    last = circuit_open(model.provider)
                    continue
                try:
                    started = await self._open(context, codec, leg, deployments, deadline)
                    started.rate_headers = limit_headers
                    for place in places:  # the call's places now end with its settlement
                        place.then, started.meter.on_finish = started.meter.on_finish, place.end
                    places.clear()
                    return started
                except GatewayError as exc:
                    if not failover(exc) or n == len(ids) - 1 or time.monotonic() >= deadline:
                        raise
                    last = exc
            raise last or UpstreamUnavailable("No upstream could serve this call.")
        finally:
            for place in places:  # refused, failed or cancelled before an upstream answered
                place.end()

    async def _open(
        self,
        context: CallContext,
        codec: Codec,
        leg: Leg,
        deployments: tuple[Deployment, ...],
        deadline: float,
    ) -> Started:
        """One candidate: reserve at its prices, open its upstream on one of ``deployments`` (``leg`` is
        the call on the first), settle on failure."""
        gw, model = self.gw, leg.model
        # (rate limits were checked once per call, in start(), before the first candidate)
        amount = worst_case(model, codec.size, codec.view, leg.upstream.max_output)
        # (PostgreSQL)
        hold = Hold(model.id, model.provider, context.request_id, context.endpoint, codec.stream)
        call = traced() if gw.tracing is not None else None
        if call is None:
            reservation = await gw.ledger.reserve(context.group_id, context.key_id, amount, hold)
        else:
            with call.reserve(amount):
                reservation = await gw.ledger.reserve(context.group_id, context.key_id, amount, hold)
        record = context.record(model.id, model.provider, codec.stream)
        meter = Meter(gw.ledger, reservation, model, record, leg.prompt)
        if call is not None:
            meter.on_record = call.finished
        async with meter.settles_on_failure():
            legs = {deployments[0].key: leg}

            def build(deployment: Deployment) -> UpstreamRequest:
                record.deployment = deployment.name  # the last one tried, if none answers
                found = legs.get(deployment.key)
                if found is None:
                    found = legs[deployment.key] = codec.leg(gw, model, leg.model_id, deployment)
                return found.upstream

            pool = gw.dispatcher.pools[model.provider]
            tokens = (
                input_ceiling(codec.size, codec.view) + output_ceiling(model, codec.view)
                if pool.tokens
                else 0
            )
            sticky = (
                codec.conversation(context.key_id, gw.settings.routing.sticky_messages)
                if pool.sticky
                else None
            )
            tried: list[list[Any]] = []
            try:
                outgoing = UpstreamCall(
                    model,
                    deployments,
                    build,
                    leg.error,
                    deadline,
                    context.group_id,
                    Ask(tokens, sticky, codec.stream),
                )
                response, lease = await open_upstream(gw, outgoing, tried)
            finally:
                if len(tried) > 1:  # retried, or moved to another deployment: each try in the record
                    record.attempts = msgspec.json.encode(tried).decode()
            meter.on_finish = lease.end
            return Started(
                legs[lease.deployment.key], meter, response, upstream_request_id(response.headers), lease
            )

    async def complete(self, started: Started) -> Answer:
        """The whole answer of a non-stream call, settled."""
        leg, meter, response = started.leg, started.meter, started.response
        async with meter.settles_on_failure():
            try:
                with self.gw.deadlines.after(started.lease.deployment.read_timeout):
                    payload = await response.read()
            except (
                TimeoutError,
                aiohttp.ClientError,
            ) as exc:  # the body broke off or stalled: nothing to bill
                provider = started.model.provider
                if isinstance(exc, TimeoutError):
                    raise UpstreamTimeout(f"The provider '{provider}' stopped sending its answer.") from None
                raise UpstreamError(
                    f"The connection to the provider '{provider}' was lost while it answered "
                    f"({type(exc).__name__})."
                ) from None
            finally:
                response.release()
            answer = leg.answer(payload)
            if self.gw.tracing is not None and (call := traced()) is not None:
                call.reasons = finish_reasons(answer.body)
            usage = answer.usage
            if usage is not None:  # its seconds per output token (routing)
                started.lease.output = usage.completion
            await meter.finish(
                usage,
                "error" if answer.error else "ok",
                generated="" if usage else leg.generated(answer.body),
                error=answer.error,
                upstream_id=started.upstream_id,
                estimated=answer.estimated,
                reply=True,
            )
            await meter.durable()  # the answer goes out once its charge is stored
            if not self.gw.settings.billing.cost_in_answer:
                return answer
            charged = cost_of(meter.record)  # the figure the settlement stores, computed once
            leg.price(answer.body, charged)
            return answer._replace(cost=charged.text)

    def relay(self, started: Started) -> AsyncGenerator[list[Any], None]:
        """The stream's batches of pieces (gateway/relay.py), settled exactly once."""
        idle = self.gw.deadlines.idle(started.lease.deployment.read_timeout)  # each read of the stream
        return relay(
            started.leg.reader(),
            started.response,
            started.meter,
            started.model.provider,
            idle,
            self.gw.settings.billing.cost_in_answer,
        )

    async def abandon(self, started: Started) -> None:
        """The consumer went away before or while reading: close the upstream, settle (no-op if done)."""
        started.response.close()
        await started.meter.finish(None, "interrupted")
