"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API for every
provider group (gateway/messages_codec.py: passed through for ``anthropic/...``, translated through chat
for the others), HTTP in and out in Anthropic's dialect: the key in ``x-api-key`` or ``Authorization:
Bearer``, errors as ``{"type": "error", "error": {...}}`` (core.errors.anthropic_error). Usage records
say endpoint ``messages``; a count is never billed nor recorded, and is rate-limited like any call.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from adapters.anthropic import messages as native
from core.catalog import ProviderSpec
from core.errors import InvalidRequest
from core.inputs import decode_object
from gateway import counting
from gateway.context import identify
from gateway.messages_codec import MessagesCodec
from gateway.messages_translate import end_user, omitted_tools
from gateway.pipeline import Pipeline
from gateway.state import Gateway
from router.chat import answered, begin_call, streamed
from router.dialects import MESSAGES, events_of
from router.replies import JSONBytes, LateSSE, name_omitted

_encode = msgspec.json.Encoder().encode
ESTIMATED = "x-router-token-count"  # count_tokens: "estimate" (the gateway's tokenizer) or "provider"


_FORWARDED = {name.encode(): name for name in native.FORWARDED}


def caller_headers(request: Request) -> tuple[str | None, dict[str, str]]:
    """In one pass over the request's headers: the caller's key as the Authorization header
    ``gateway.auth`` reads (Claude Code and the Anthropic SDKs send it in ``x-api-key``,
    ``ANTHROPIC_API_KEY``, or as a bearer token, ``ANTHROPIC_AUTH_TOKEN``), and the headers that go
    upstream as sent (``anthropic-version``, ``anthropic-beta``). The first of a repeated header counts."""
    given = key = None
    sent: dict[str, str] = {}
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            if given is None:
                given = value.decode("latin-1")
        elif name == b"x-api-key":
            if key is None:
                key = value.decode("latin-1")
        elif name in _FORWARDED and value and _FORWARDED[name] not in sent:
            sent[_FORWARDED[name]] = value.decode("latin-1")
    return given or (f"Bearer {key}" if key else None), sent


def parse_body(raw: bytes, count: bool = False) -> dict[str, Any]:
    body, _ = decode_object(raw, "tools")  # (Claude Code sends the same tools every turn: decoded once)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: Field required", param="model", code="missing_required_parameter")
    if not isinstance(body.get("messages"), list):
        raise InvalidRequest("messages: Field required", param="messages", code="missing_required_parameter")
    if not body["messages"]:
        raise InvalidRequest(
            "messages: at least one message is required", param="messages", code="invalid_value"
        )
    if count:
        body["max_tokens"] = 1
        return body
    cap = body.get("max_tokens")
    if cap is None:
        raise InvalidRequest(
            "max_tokens: Field required", param="max_tokens", code="missing_required_parameter"
        )
    if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= 100_000_000:
        raise InvalidRequest(
            "max_tokens: Input should be a valid integer greater than or equal to 1",
            param="max_tokens",
            code="invalid_value",
        )
    if body.get("stream") not in (None, True, False):
        raise InvalidRequest("stream: Input should be a valid boolean", param="stream", code="invalid_type")
    return body


def _runs_hosted(spec: ProviderSpec) -> bool:
    """Anthropic's hosted tools run where the provider speaks Anthropic's protocol."""
    return spec.protocol == "anthropic"


class Messages:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        authorization, sent = caller_headers(request)
        context, trace, raw = await begin_call(gw, request, "messages", authorization=authorization)
        body = parse_body(raw)
        trace.model, trace.stream = body["model"], body.get("stream") is True
        user = end_user(body) if "metadata" in body else None
        if user is not None:
            who = {"user": user}
            identify(context, who)  # (a key pasted there is redacted, upstream too)
            if who["user"] is not None and who["user"] != user:
                body["metadata"] = {**body["metadata"], "user_id": who["user"]}
        codec = MessagesCodec(body, len(raw), sent)
        start = self.pipeline.start(context, codec)
        if not codec.stream:
            response = await answered(self.pipeline, start, trace)
        else:
            stream = streamed(self.pipeline, start, trace, joined)
            response = LateSSE(stream, gw.settings.reliability.stream_keepalive, events_of(MESSAGES))
        if body.get("tools"):
            name_omitted(response, gw.catalog, body["model"], omitted_tools(body), _runs_hosted)
        return response

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's own count for an Anthropic model; elsewhere the gateway's tokenizer's (an
        estimate, said in ``x-router-token-count``). Checked and rate-limited like a call, never billed."""
        authorization, sent = caller_headers(request)
        context, trace, raw = await begin_call(self.gw, request, "messages", authorization=authorization)
        context.metered = True  # (so no refusal of a count is recorded as a call: a count is never usage)
        body = parse_body(raw, count=True)
        trace.model = body["model"]
        count = await counting.count_tokens(self.gw, context.principal, body, len(raw), sent)
        extra = [*(count.rate_headers or ()), (ESTIMATED.encode(), count.source.encode())]
        return JSONBytes(_encode({"input_tokens": count.input_tokens}), extra=extra)


async def joined(batches: Any) -> Any:
    """The encoder of a Messages stream: its pieces are SSE frames already."""
    try:
        async for batch in batches:
            yield b"".join(batch)
    finally:
        await batches.aclose()
