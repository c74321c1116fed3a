"""The Responses codec: ``POST /v1/responses`` for every group, one codec whose legs differ by the
serving model's provider (docs/architecture.md, "Codecs"):

    native      the provider speaks the Responses API itself (catalog: ``responses_api``): the body goes
                through to ``{base_url}/responses`` (:mod:`adapters.openai_responses`), usage read from
                the final response
    translated  any other provider: Responses → chat request (:mod:`gateway.responses_translate`) → a
                chat leg (:mod:`gateway.chat_codec`) → a Response object, or streamed, the event
                sequence the native API emits (:mod:`gateway.responses_events`)

A call's candidates may mix both (a fallback of an OpenAI model on another provider). A stream's
pieces are SSE frames (``bytes``) and, last, its terminal event as a :class:`Terminal`, left unframed
so the endpoint can keep the final response before the caller sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from adapters import openai_responses
from adapters.base import map_upstream_error
from core.catalog import Model
from core.deployments import Deployment
from core.errors import GatewayError, InvalidRequest
from core.sse import event_parts, frame_event
from core.wire import ChatRequest, FunctionDef, ImagePart, ImageURL, Message, TokenUsage, Tool, chat_struct
from gateway.chat_codec import ChatCodec, ChatLeg
from gateway.codec import Answer, ChatBackedLeg, ChatWrapper, Codec, Cost, Leg, RelayReader, fallback_list
from gateway.conversation import upstream_item
from gateway.responses_events import EventSynth, Options, responses_usage
from gateway.responses_translate import (
    cache_marked,
    encoded_tools,
    estimate_prompt,
    from_completion,
    image_urls,
    options,
    shell,
    to_chat,
)
from gateway.routing import conversation
from gateway.state import Gateway
from gateway.stream import ChatReader, error_chunk

SAMPLING = frozenset({"temperature", "top_p", "top_logprobs"})  # the Responses API's sampling options
_SOME_TOOL = Tool(function=FunctionDef(name="tools"))  # the view says only whether the call has tools

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Terminal:
    """The terminal event of a Responses stream (``response.completed``, ``.incomplete``, ``.failed``)."""

    event: dict[str, Any]

    @property
    def response(self) -> dict[str, Any]:
        return self.event["response"]

    def frame(self) -> bytes:
        return frame_event(self.event["type"], _encode(self.event))


def responses_priced(response: dict[str, Any], cost: Cost) -> None:
    """Put ``cost`` into a Response object's ``usage`` (the counts charged when it has none)."""
    usage = response.get("usage")
    if not isinstance(usage, dict):
        usage = responses_usage(cost.usage.openai()) or {}
    response["usage"] = {**usage, "cost": cost.amount}


def frames(events: list[Any]) -> bytes:
    """Events as SSE frames (an event the synthesiser wrote as its frame already passes as it is)."""
    if len(events) == 1 and events[0].__class__ is bytes:  # (most reads of a stream: one text delta)
        return events[0]
    parts: list[bytes] = []
    for e in events:  # (one join: a Response object with its tools' echo is copied once, not per frame)
        if e.__class__ is bytes:
            parts.append(e)
        else:
            parts += event_parts(e["type"], _encode(e))
    return b"".join(parts)


def reserve_request(body: dict[str, Any]) -> ChatRequest:
    """The chat-shaped view of a Responses call that the checks, rate limits and worst case read."""
    urls = image_urls(body)
    parts: list[Any] = [ImagePart(image_url=ImageURL(url=url)) for url in urls]
    cap = body.get("max_output_tokens")
    tools = body.get("tools")
    return ChatRequest(
        model=str(body["model"]),
        messages=[Message(role="user", content=parts)] if parts else [],
        max_completion_tokens=cap if isinstance(cap, int) and cap > 0 else None,
        tools=[_SOME_TOOL] if isinstance(tools, list) and tools else None,
    )


def chat_request(chat: dict[str, Any]) -> ChatRequest:
    try:
        return chat_struct(chat)
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


class ResponsesCodec(Codec):
    """A Responses request (``body``, decoded; ``size``: an upper bound of its prompt's bytes)."""

    endpoint = "responses"
    image_param = "input"
    cap_param = "max_output_tokens"

    def __init__(
        self, body: dict[str, Any], size: int, echo: dict[str, Any] | None = None, tools: bytes | None = None
    ) -> None:
        models = fallback_list(body)
        super().__init__(reserve_request(body), size, bool(body.get("stream")), models)
        self.body = body
        # fields of the Response object the gateway decides (id, store, previous_response_id)
        self.echo = echo
        self.sent = tools  # the body's tools as the caller sent them (their bytes), if known
        self._translated: tuple[dict[str, Any], ChatRequest, Options] | None = None
        self._tools: bytes | None = None  # the request's tools encoded (once translated)

    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> Leg:
        if gw.catalog.providers[model.provider].responses_api and not deployment.kind:
            return NativeLeg(gw, model, model_id, self.body, deployment, self.echo)
        if self._translated is None:  # (the same for every translated candidate)
            sealer = gw.sealer
            self._tools = encoded_tools(self.body, self.sent)
            chat = to_chat(self.body, sealer.open if sealer is not None else None, self._tools)
            self._translated = (
                chat,
                chat_request(chat),
                options(self.body, sealer.seal if sealer is not None else None, self._tools),
            )
        chat, req, how = self._translated
        if self.body.get("prompt_cache_key") and gw.catalog.providers[model.provider].protocol == "anthropic":
            chat = cache_marked(chat)  # Anthropic caches up to a marked block: the instructions (and tools)
        inner = ChatCodec(chat, req, self.size, "responses").leg(gw, model, model_id, deployment)
        response = shell(self.body, model_id, self._tools)
        if self.echo:
            response.update(self.echo)
        return TranslatedLeg(inner, response, how)

    def conversation(self, key_id: int, first: int) -> bytes:
        return conversation(key_id, self.body, first)

    def deployments(self, gw: Gateway, model: Model) -> tuple[Deployment, ...]:
        """Where the provider speaks the Responses API, its deployments that do (an Azure one is
        reached through chat), unless none serves the model."""
        serving = super().deployments(gw, model)
        if gw.catalog.providers[model.provider].responses_api:
            return tuple(d for d in serving if not d.kind) or serving
        return serving


def native_body(body: dict[str, Any]) -> dict[str, Any]:
    """The body as it goes to a provider that speaks the Responses API: ``store: false`` (the gateway's
    own store keeps the response: docs/api.md, "Stored responses"), no ``background`` (run
    here), and input items without ids or unreadable reasoning items (an upstream that keeps nothing
    refuses ids it does not know)."""
    out = {name: value for name, value in body.items() if name != "background"}
    out["store"] = False
    given = out.get("input")
    if isinstance(given, list):
        items = []
        for item in given:
            if isinstance(item, dict) and item.get("type") != "item_reference":
                item = upstream_item(item)
            if item is not None:
                items.append(item)
        out["input"] = items
    return out


class NativeLeg(Leg):
    __slots__ = ("body", "echo", "provider")

    def __init__(
        self,
        gw: Gateway,
        model: Model,
        model_id: str,
        body: dict[str, Any],
        deployment: Deployment,
        echo: dict[str, Any] | None = None,
    ) -> None:
        if model.reasoning:  # sampling options a reasoning model refuses (catalog data, as for chat)
            drop = SAMPLING.intersection(gw.catalog.providers[model.provider].reasoning_drop_fields)
            body = {name: value for name, value in body.items() if name not in drop}
        upstream = openai_responses.build_request(
            deployment, native_body(body), deployment.upstream_name(model)
        )
        super().__init__(model, model_id, upstream)
        self.body = body
        self.echo = echo
        self.provider = model.provider

    @property
    def prompt(self) -> dict[str, Any]:
        return estimate_prompt(self.body)

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        return map_upstream_error(self.provider, status, body, headers)

    def answer(self, payload: bytes) -> Answer:
        data, usage = openai_responses.parse_response(payload, self.model_id, self.provider, self.echo)
        error = data.get("error") if data.get("status") == "failed" else None
        return Answer(data, usage, str(error.get("message")) if isinstance(error, dict) else None)

    def generated(self, body: dict[str, Any]) -> str:
        return openai_responses.output_text(body)

    def reader(self) -> NativeReader:
        return NativeReader(openai_responses.ResponsesRelay(self.model_id, self.provider, self.echo))

    def price(self, body: dict[str, Any], cost: Cost) -> None:
        responses_priced(body, cost)


class NativeReader(RelayReader):
    """The upstream's own events, relayed (model rewritten), the terminal one held back."""

    relay: openai_responses.ResponsesRelay

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        return self.relay.usage, None

    def end(self) -> list[Any]:
        return [self._priced(Terminal(self.relay.terminal))] if self.relay.terminal is not None else []

    def fail(self, exc: GatewayError) -> list[Any]:
        event = self.relay.fail(exc.message)
        self.error = self.relay.error
        return [self._priced(Terminal(event))]

    def _priced(self, terminal: Terminal) -> Terminal:
        if self.cost is not None:
            responses_priced(terminal.response, self.cost)
        return terminal


class TranslatedLeg(ChatBackedLeg):
    __slots__ = ("how", "shell")
    inner: ChatLeg

    def __init__(self, inner: ChatLeg, response: dict[str, Any], how: Options) -> None:
        super().__init__(inner)
        self.shell = response  # the Response object before any output
        self.how = how  # summaries, the caller's tool names, the sealer (gateway/responses_events.py)

    def translate(self, completion: dict[str, Any]) -> dict[str, Any]:
        return from_completion(completion, self.shell, self.how)

    def generated(self, body: dict[str, Any]) -> str:
        return openai_responses.output_text(body)

    def reader(self) -> SynthReader:
        return SynthReader(self.inner.reader(stamp=False), EventSynth(self.shell, self.how))

    def price(self, body: dict[str, Any], cost: Cost) -> None:
        responses_priced(body, cost)


class SynthReader(ChatWrapper):
    """A chat stream (:class:`~gateway.stream.ChatReader`) → the Responses event sequence."""

    __slots__ = ("synth",)

    def __init__(self, inner: ChatReader, synth: EventSynth) -> None:
        super().__init__(inner)
        self.synth = synth

    def start(self) -> list[Any]:
        return self.synth.start()

    def _chunks(self, chunks: list[Any], out: list[Any]) -> None:
        synth = self.synth
        events = [event for chunk in chunks for event in synth.feed(chunk)]
        if events:
            out.append(frames(events))

    def end(self) -> list[Any]:
        synth = self.synth
        for chunk in self.inner.end():  # the usage chunk
            synth.feed(chunk)
        return self._terminal(synth.finish())

    def fail(self, exc: GatewayError) -> list[Any]:
        return self._terminal(self.synth.feed(error_chunk(exc)))

    def _terminal(self, events: list[dict[str, Any]]) -> list[Any]:
        head = [frames(events[:-1])] if len(events) > 1 else []
        if not events:
            return head
        terminal = Terminal(events[-1])
        if self.cost is not None:
            responses_priced(terminal.response, self.cost)
        return [*head, terminal]
