"""``POST /v1/responses`` for every provider group: HTTP in, the pipeline with the Responses codec
(gateway/responses_codec.py: native pass-through for a provider that speaks the Responses API,
translated through chat for the others), HTTP out. Usage records say endpoint ``responses``.

Around the call, the stored responses (docs/api.md, "Stored responses"): the conversation
is resolved from them first (``previous_response_id``, ``item_reference``: gateway/conversation.py),
and the finished response is stored before the caller sees it (gateway/response_keep.py); a
``background: true`` request is checked, queued for jobs/background.py and answered at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from core.errors import InvalidRequest
from core.inputs import decode_object
from gateway.context import CallContext, identify
from gateway.conversation import Conversation, expand, plain
from gateway.pipeline import Pipeline
from gateway.response_keep import Keep
from gateway.responses_codec import ResponsesCodec, Terminal
from gateway.responses_events import item_id
from gateway.responses_translate import omitted_tools, shell
from gateway.state import Gateway
from router.chat import Encoder, begin_call, streamed
from router.dialects import RESPONSES, events_of
from router.logs import Trace
from router.replies import JSONBytes, LateSSE, name_omitted

_encode = msgspec.json.Encoder().encode


def parse_body(raw: bytes) -> tuple[dict[str, Any], bytes | None]:
    """The request, and its tools as sent (their bytes: decoded once per distinct set, see
    :func:`core.inputs.decode_object`, and echoed as they came)."""
    body, tools = decode_object(raw, "tools")
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    if body.get("stream") not in (None, True, False):
        raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
    if "input" in body and not isinstance(body["input"], (str, list)):
        raise InvalidRequest(
            "Invalid type for 'input': expected a string or an array of input items.",
            param="input",
            code="invalid_type",
        )
    return body, tools


def events(keep: Keep, conversation: Conversation) -> Encoder:
    """The encoder of a Responses stream: its pieces as SSE bytes, the terminal event framed last,
    once its response is stored."""

    async def encode(batches: AsyncGenerator[list[Any], None]) -> AsyncGenerator[bytes, None]:
        try:
            async for batch in batches:
                out = []
                for piece in batch:
                    if piece.__class__ is Terminal:
                        await keep.answer(piece.response, conversation)
                        piece = piece.frame()
                    out.append(piece)
                yield b"".join(out)
        finally:
            await batches.aclose()

    return encode


class Responses:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        context, trace, raw = await begin_call(gw, request, "responses")
        body, tools = parse_body(raw)
        trace.model, trace.stream = body["model"], bool(body.get("stream"))
        identify(context, body)
        keep = Keep.of(gw, context, body, len(raw))  # before anything is reserved or sent
        conversation = plain(body) or await expand(
            gw.responses, context.group_id, body, gw.settings.responses.max_chain
        )
        size = len(_encode(conversation.body)) if conversation.expanded else len(raw)
        keep.check_context(conversation, size)
        run = (
            _encode({k: v for k, v in body.items() if k not in ("background", "stream")})
            if keep.background
            else b""
        )
        # (its tools are raw's)
        codec = ResponsesCodec(conversation.body, size, keep.echo(conversation), tools)
        if keep.background:
            return await self.queue(context, codec, keep, conversation, run)
        start = self.pipeline.start(context, codec)
        if not codec.stream:
            response: Response = await self.answered(start, trace, keep, conversation)
        else:
            stream = streamed(self.pipeline, start, trace, events(keep, conversation))
            response = LateSSE(stream, gw.settings.reliability.stream_keepalive, events_of(RESPONSES))
        name_omitted(
            response,
            gw.catalog,
            conversation.body.get("model"),
            omitted_tools(conversation.body, tools),
            lambda spec: spec.responses_api,
        )  # (OpenAI runs its hosted tools)
        return response

    async def answered(self, start: Any, trace: Trace, keep: Keep, conversation: Conversation) -> Response:
        started = await start
        trace.served(started.model.provider, started.deployment)  # for the access log
        answer = await self.pipeline.complete(started)  # settled
        payload = _encode(answer.body)  # (encoded once: the answer and the stored row)
        if not await keep.answer(answer.body, conversation, payload):
            payload = _encode(answer.body)  # it says store: false now
        extra = started.rate_headers
        if answer.cost is not None:
            extra = [*(extra or ()), (b"x-request-cost", answer.cost.encode())]
        return JSONBytes(payload, extra=extra)

    async def queue(
        self, context: CallContext, codec: ResponsesCodec, keep: Keep, conversation: Conversation, run: bytes
    ) -> Response:
        """``background: true``: checked as the call will be (a bad request is a 400 now, not a failed
        response later), stored ``queued`` with the request to run, answered at once."""
        gw = self.gw
        model = self.pipeline.check(
            context.principal,
            codec.view,
            "responses",
            image_param=codec.image_param,
            cap_param=codec.cap_param,
        )
        deployments = codec.deployments(gw, model)
        if deployments:
            codec.leg(gw, model, codec.view.model, deployments[0])  # the translation's 400s
        response = shell(conversation.body, codec.view.model)
        response.update(
            id=item_id("resp"),
            status="queued",
            background=True,
            store=True,
            previous_response_id=conversation.previous,
        )
        await keep.queue(response, conversation, run)
        if gw.backgrounds is not None:
            gw.backgrounds.poke_background()
        return JSONBytes(_encode(response))
