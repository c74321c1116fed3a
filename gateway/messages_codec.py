"""The Messages codec: ``POST /v1/messages`` (Anthropic's API) for every group, one codec whose legs
differ by the serving model's protocol (docs/architecture.md, "Codecs"):

    native      an ``anthropic`` protocol model: the body goes through to ``{base_url}/messages``
                (:mod:`adapters.anthropic.messages`) with the caller's ``anthropic-version`` and
                ``anthropic-beta``, the answer and the stream come back as the provider sent them
                (the caller's model id echoed), usage read from them
    translated  any other: Messages → chat request (:mod:`gateway.messages_translate`) → a chat leg
                (:mod:`gateway.chat_codec`) → an Anthropic message, or streamed, the event sequence
                the API emits (:mod:`gateway.messages_events`)

A call's candidates may mix both (a fallback of a Claude model on another provider). A stream's pieces
are SSE frames (``bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from adapters.anthropic import messages as native
from adapters.base import error_message, map_upstream_error
from core.catalog import Model
from core.deployments import Deployment
from core.errors import GatewayError, InvalidRequest, PayloadTooLarge
from core.wire import ChatRequest, TokenUsage, chat_struct
from gateway.chat_codec import ChatCodec, ChatLeg
from gateway.codec import Answer, ChatBackedLeg, ChatWrapper, Codec, Cost, Leg, RelayReader
from gateway.messages_events import MessageSynth, error_event
from gateway.messages_translate import estimate_prompt, from_completion, message_id, reserve_request, to_chat
from gateway.routing import conversation
from gateway.state import Gateway
from gateway.stream import ChatReader

_encode = msgspec.json.Encoder().encode


def body_cap(body: dict[str, Any]) -> int:
    cap = body.get("max_tokens")
    return cap if isinstance(cap, int) else 0


def priced(usage: Any, cost: Cost) -> dict[str, Any]:
    """An Anthropic usage object with ``cost`` (the charge, exact)."""
    return {**(usage if isinstance(usage, dict) else {}), "cost": cost.amount}


def chat_request(chat: dict[str, Any]) -> ChatRequest:
    try:
        return chat_struct(chat)
    except msgspec.ValidationError as exc:
        text = str(exc)
        path = text.rpartition(" - at `$.")[2].rstrip("`") if " - at `$." in text else ""
        field = path.split("[", 1)[0].split(".", 1)[0]
        param = {"stop": "stop_sequences", "max_tokens": "max_tokens"}.get(field, field) or None
        raise InvalidRequest(
            f"{param or 'request'}: {text.partition(' - at `')[0]}", param=param, code="invalid_value"
        ) from None


class MessagesCodec(Codec):
    """A Messages request (``body``, decoded and checked by the endpoint; ``size``: its bytes);
    ``forwarded``: the caller's ``anthropic-version`` and ``anthropic-beta`` headers."""

    endpoint = "messages"
    cap_param = "max_tokens"
    # Claude Code asks 32,000 output tokens of a model it does not know (128,000 of one it does): a cap
    # over the serving model's ceiling is lowered to it, not refused
    clamp_cap = True

    def __init__(self, body: dict[str, Any], size: int, forwarded: Mapping[str, str]) -> None:
        super().__init__(reserve_request(body), size, body.get("stream") is True, [])
        self.body = body
        self.forwarded = forwarded
        self._translated: tuple[dict[str, Any], ChatRequest] | None = None

    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> Leg:
        cap = model.max_output
        if gw.catalog.providers[model.provider].protocol == "anthropic":
            body = self.body if not cap or body_cap(self.body) <= cap else {**self.body, "max_tokens": cap}
            return NativeLeg(model, model_id, body, deployment, self.forwarded)
        if self._translated is None:  # (the same for every translated candidate)
            chat = to_chat(self.body)
            self._translated = chat, chat_request(chat)
        chat, req = self._translated
        if (
            "reasoning_effort" in chat
            and not model.reasoning
            and gw.catalog.providers[model.provider].protocol == "openai"
        ):
            chat = {name: value for name, value in chat.items() if name != "reasoning_effort"}
        if cap and chat["max_tokens"] > cap:
            chat, req = {**chat, "max_tokens": cap}, msgspec.structs.replace(req, max_tokens=cap)
        inner = ChatCodec(chat, req, self.size, "messages").leg(gw, model, model_id, deployment)
        return TranslatedLeg(inner)

    def conversation(self, key_id: int, first: int) -> bytes:
        return conversation(key_id, self.body, first)


class NativeLeg(Leg):
    __slots__ = ("body", "provider")

    def __init__(
        self,
        model: Model,
        model_id: str,
        body: dict[str, Any],
        deployment: Deployment,
        forwarded: Mapping[str, str],
    ) -> None:
        super().__init__(
            model,
            model_id,
            native.build_request(deployment, body, deployment.upstream_name(model), forwarded),
        )
        self.body = body
        self.provider = model.provider

    @property
    def prompt(self) -> dict[str, Any]:
        return estimate_prompt(self.body)

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        """As any upstream error, but a refusal of the caller's request keeps Anthropic's own words
        (Claude Code recovers by them: "Prompt is too long", "Extra inputs are not permitted", ...)."""
        error = map_upstream_error(self.provider, status, body, headers)
        if status in (400, 413) and isinstance(error, InvalidRequest):
            message, _ = error_message(body)
            if message:
                return (PayloadTooLarge if status == 413 else InvalidRequest)(message, code=error.code)
        return error

    def answer(self, payload: bytes) -> Answer:
        data, usage = native.parse_message(payload, self.model_id, self.provider)
        return Answer(data, usage)

    def generated(self, body: dict[str, Any]) -> str:
        return native.message_text(body)

    def reader(self) -> NativeReader:
        return NativeReader(native.MessagesRelay(self.model_id, self.provider))

    def price(self, body: dict[str, Any], cost: Cost) -> None:
        body["usage"] = priced(body.get("usage"), cost)


class NativeReader(RelayReader):
    """The upstream's own events relayed (the model id rewritten in ``message_start``)."""

    relay: native.MessagesRelay

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        return self.relay.usage, self.relay.prompt_usage

    def end(self) -> list[Any]:
        """The held message_delta, with the charge in its usage (as a translated stream's), and message_stop."""
        return self.relay.tail(self.cost.amount if self.cost is not None else None)

    def fail(self, exc: GatewayError) -> list[Any]:
        return [*self.relay.tail(), error_event(exc)]


class TranslatedLeg(ChatBackedLeg):
    __slots__ = ()
    inner: ChatLeg

    def translate(self, completion: dict[str, Any]) -> dict[str, Any]:
        return from_completion(completion, self.model_id)

    def generated(self, body: dict[str, Any]) -> str:
        return native.message_text(body)

    def reader(self) -> SynthReader:
        return SynthReader(self.inner.reader(stamp=False), MessageSynth(message_id(), self.model_id))

    def price(self, body: dict[str, Any], cost: Cost) -> None:
        body["usage"] = priced(body.get("usage"), cost)


class SynthReader(ChatWrapper):
    """A chat stream (:class:`~gateway.stream.ChatReader`) → Anthropic's event sequence."""

    __slots__ = ("synth",)

    def __init__(self, inner: ChatReader, synth: MessageSynth) -> None:
        super().__init__(inner)
        self.synth = synth

    def start(self) -> list[Any]:
        return [self.synth.start()]

    def _chunks(self, chunks: list[Any], out: list[Any]) -> None:
        frames: list[bytes] = []
        feed = self.synth.feed
        for chunk in chunks:
            feed(chunk, frames)
        if frames:
            out.append(b"".join(frames))

    def end(self) -> list[Any]:
        synth = self.synth
        frames: list[bytes] = []
        for chunk in self.inner.end():  # the usage chunk
            synth.feed(chunk, frames)
        if synth.usage is None and self.cost is not None:  # no usage reported: the counts charged
            synth.usage = self.cost.usage.openai()
        synth.finish(frames, self.cost.amount if self.cost is not None else None)
        return [b"".join(frames)]

    def fail(self, exc: GatewayError) -> list[Any]:
        self.synth.done = True
        return [error_event(exc)]
