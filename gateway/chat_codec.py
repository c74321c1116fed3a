"""The chat codec: ``POST /v1/chat/completions`` (and the translated Responses legs) through any
adapter. The answer is an OpenAI ``chat.completion`` in one key order whatever the provider; a stream
is the normalised chunk stream of :mod:`gateway.stream`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec

from adapters.base import Adapter, Call, over_account
from billing import tokens
from core.catalog import Model
from core.deployments import Deployment
from core.errors import GatewayError, RateLimited
from core.types import Endpoint, new_id
from core.wire import ChatRequest, TokenUsage
from gateway.codec import Answer, Codec, Leg, fallback_list
from gateway.routing import conversation
from gateway.state import Gateway
from gateway.stream import ChatReader, Shaper

_decode = msgspec.json.Decoder().decode


def completion_id() -> str:
    return "chatcmpl-" + new_id()


def answer_text(data: dict[str, Any]) -> str:
    parts = []
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        for field in ("content", "reasoning_content"):
            if isinstance(message.get(field), str):
                parts.append(message[field])
    return "".join(parts)


class ChatCodec(Codec):
    """A chat request: ``raw`` is its decoded body (unknown fields pass through), ``req`` its view."""

    def __init__(
        self,
        raw: dict[str, Any],
        req: ChatRequest,
        size: int,
        endpoint: Endpoint = "chat",
        encode_only: bool = False,
    ) -> None:
        # (Codec's fields set here directly: this runs on every chat call)
        self.view, self.size, self.stream, self.endpoint = req, size, bool(req.stream), endpoint
        self.models = fallback_list(raw) if "models" in raw or "route" in raw else []
        self.raw = raw
        # the consumer only encodes what it gets (the chunks, the answer): plain parts may stay bytes
        self.encode_only = encode_only

    def conversation(self, key_id: int, first: int) -> bytes:
        return conversation(key_id, self.raw, first)

    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> ChatLeg:
        req = self.view
        stream = self.stream
        call = Call(
            model_id=model_id,
            model=model,
            deployment=deployment,
            raw=self.raw,
            request=req,
            stream=stream,
            include_usage=bool(stream and req.stream_options and req.stream_options.include_usage),
        )
        return ChatLeg(call, gw.adapters[model.provider], self.encode_only)


class ChatLeg(Leg):
    __slots__ = ("call", "adapter", "encode_only")

    def __init__(self, call: Call, adapter: Adapter, encode_only: bool) -> None:
        super().__init__(call.model, call.model_id, adapter.build_request(call))
        self.call = call
        self.adapter = adapter
        self.encode_only = encode_only

    @property
    def prompt(self) -> dict[str, Any]:
        return self.call.raw

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        error = self.adapter.error(status, body, headers)
        if isinstance(error, RateLimited) and error.input_tpm:
            return too_large_for(error, self.adapter.name, self.call.raw)
        return error

    def answer(self, payload: bytes) -> Answer:
        # a plain answer (Adapter.plain_answer) keeps its fields as the upstream's bytes: of them only
        # ``created`` is read here
        plain = self.adapter.plain_answer(self.call, payload) if self.encode_only else None
        data: dict[str, Any]
        usage: TokenUsage | None
        data, usage = plain if plain is not None else self.adapter.parse_response(self.call, payload)
        pop = data.pop
        created = pop("created", None)
        if plain is not None and created is not None:
            created = _decode(created)
        pop("id", None), pop("object", None), pop("model", None)
        body = {  # the same key order whatever the provider; the upstream's other fields after ours
            "id": completion_id(),
            "object": "chat.completion",
            "created": created or int(time.time()),
            "model": self.call.model_id,
            "choices": pop("choices"),
            "usage": pop("usage", None) or (usage.openai() if usage is not None else None),
            **data,
        }
        return Answer(body, usage)

    def generated(self, body: dict[str, Any]) -> str:
        return answer_text(body)

    def reader(self, stamp: bool = True) -> ChatReader:
        """``stamp``: False when the chunks become another endpoint's events (:class:`Shaper`)."""
        call = self.call
        shaper = Shaper(call, completion_id(), int(time.time()), stamp)
        return ChatReader(call, self.adapter.stream(call), shaper, self.encode_only)


# how far over a provider's per-minute input limit the gateway's estimate of a call's input must be to
# call the call too large (the estimate is the gateway's tokenizer's, not the provider's own count)
OVER = 1.25


def too_large_for(error: RateLimited, provider: str, request: dict[str, Any]) -> GatewayError:
    """A 429 that names the account's input tokens per minute (``error.input_tpm``; Anthropic's words
    are the same whether the minute's usage or the call alone is over it): the call alone, when its
    prompt is well over the limit, which no wait cures (UpstreamTooLarge: never retried, no deployment
    rests for it); else the rate limit it says."""
    limit = error.input_tpm or 0
    estimate = tokens.count_request(request)
    if estimate < limit * OVER:
        return error
    return over_account(provider, f" (input tokens per minute): limit {limit}, requested about {estimate}")
