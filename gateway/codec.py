"""The seam between the call lifecycle and an endpoint's wire (docs/architecture.md, "Codecs").

The pipeline (:mod:`gateway.pipeline`) does what every model call does — resolve the candidates,
check, rate-limit, consult the breaker, reserve, open the upstream with retries and fallbacks, relay,
settle once — and asks a codec only what differs between endpoints and wire protocols:

    Codec      one call as its endpoint received it: the endpoint, the chat-shaped ``view`` that the
               checks, the rate limits and the worst case read, the prompt's size bound, stream or
               not; ``leg(model)`` for each candidate model
    Leg        that call for one candidate, in that model's wire protocol: the upstream request, how
               an upstream error maps, how the answer is read (``answer``) or streamed (``reader``)
    Reader     one upstream stream: network bytes in, the caller's pieces out; it knows when the
               upstream ended properly, the usage it reported, and the pieces that end the caller's
               stream (after a proper end, or after a failure)

Chat (:mod:`gateway.chat_codec`) and Responses (:mod:`gateway.responses_codec`: native pass-through
or translated through a chat leg) are codecs; the next endpoint is one more.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec

from billing.store import UsageRecord
from core.catalog import Model
from core.errors import GatewayError, InvalidRequest
from core.money import to_credits
from core.sse import Event, SSEDecoder
from core.types import Endpoint
from core.wire import ChatRequest, TokenUsage

if TYPE_CHECKING:
    from adapters.base import UpstreamRequest
    from core.deployments import Deployment
    from gateway.state import Gateway


class Answer(NamedTuple):
    """A non-stream answer: the caller's body, the usage the upstream reported, and an error the
    upstream reported inside a 200 (a Responses object with ``status: failed``); once settled, the
    credits it was charged (``cost``, the exact decimal of ``x-request-cost``) if they are shown."""

    body: dict[str, Any]
    usage: TokenUsage | None
    error: str | None = None
    estimated: bool = False  # ``usage`` was counted by the gateway, not reported (Gemini embeddings)
    cost: str | None = None


class Cost(NamedTuple):
    """What a settled call was charged, for the caller's answer: ``text``, the exact decimal of the
    usage record's credits; ``amount``, the same as a JSON number (``msgspec.Raw``: written as is, no
    float in between); ``usage``, the counts it was charged for (the upstream's, or the estimate)."""

    text: str
    amount: msgspec.Raw
    usage: TokenUsage


def cost_of(record: UsageRecord) -> Cost:
    """The charge of a settled call (``Meter.finish`` filled ``record``): the same figure the ledger
    stores, computed once."""
    text = to_credits(record.credits)
    usage = TokenUsage(
        prompt=record.prompt_tokens,
        completion=record.completion_tokens,
        cached=record.cached_tokens,
        cache_write=record.cache_write_tokens,
        reasoning=record.reasoning_tokens,
    )
    return Cost(text, msgspec.Raw(text.encode()), usage)


def chat_priced(usage: Any, cost: Cost) -> dict[str, Any]:
    """A chat usage object with ``cost`` (the record's counts when the upstream gave none)."""
    base = usage if isinstance(usage, dict) else cost.usage.openai()
    return {**base, "cost": cost.amount}


class Reader(ABC):
    """One upstream stream → the caller's pieces (chunk dicts or their bytes, or SSE frames).

    While and after the stream: ``finished`` (the upstream ended it properly), ``error`` (a failure it
    reported in-band, even in a proper end); :meth:`reported` gives the usage it reported."""

    finished = False
    error: str | None = None
    cost: Cost | None = None  # set by the relay once settled, before end() or fail(), if it is shown

    @abstractmethod
    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        """The usage the upstream reported, and the prompt's counts if it told them before the end."""

    @property
    def complete(self) -> bool:
        """The answer is whole (checked when the upstream stream is over)."""
        return self.finished

    def start(self) -> list[Any]:
        """Pieces that open the caller's stream, before anything came from upstream."""
        return []

    @abstractmethod
    def feed(self, data: bytes, out: list[Any]) -> None:
        """One network read of the upstream stream: its pieces appended to ``out`` (those before a
        failure stay there when it raises)."""

    @abstractmethod
    def close(self, out: list[Any]) -> None:
        """The upstream closed its stream: what its last bytes held, appended to ``out``."""

    @abstractmethod
    def end(self) -> list[Any]:
        """The pieces that end the caller's stream after a proper end (a usage chunk, ...)."""

    @abstractmethod
    def fail(self, exc: GatewayError) -> list[Any]:
        """The pieces that end the caller's stream after ``exc`` broke it off."""

    @abstractmethod
    def generated(self) -> str:
        """Everything generated so far, as text (to estimate its tokens when no usage came)."""


class Relay(Protocol):
    """An upstream's own event stream, passed on: each event → the caller's frames (adapters:
    openai_responses.ResponsesRelay, anthropic.messages.MessagesRelay)."""

    finished: bool
    error: str | None

    def feed(self, event: Event) -> list[bytes]: ...

    def generated_text(self) -> str: ...


class RelayReader(Reader):
    """A stream passed on event by event (a native leg): the upstream's SSE decoded, each event to
    ``relay``; its end and error are the relay's."""

    __slots__ = ("relay", "decoder")

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.decoder = SSEDecoder()

    def feed(self, data: bytes, out: list[Any]) -> None:
        self._events(self.decoder.feed(data), out)

    def close(self, out: list[Any]) -> None:
        self._events(self.decoder.close(), out)

    def _events(self, events: list[Event], out: list[Any]) -> None:
        relay = self.relay
        try:
            for event in events:
                out += relay.feed(event)
        finally:
            self.finished, self.error = relay.finished, relay.error

    def generated(self) -> str:
        return self.relay.generated_text()


class ChatWrapper(Reader):
    """A chat stream written in another endpoint's events (a translated leg): the chat reader's chunks
    of each read to :meth:`_chunks`; the rest is the chat reader's."""

    __slots__ = ("inner",)

    def __init__(self, inner: Reader) -> None:
        self.inner = inner

    def feed(self, data: bytes, out: list[Any]) -> None:
        chunks: list[Any] = []
        try:
            self.inner.feed(data, chunks)
        finally:
            self.finished = self.inner.finished
            self._chunks(chunks, out)

    def close(self, out: list[Any]) -> None:
        chunks: list[Any] = []
        try:
            self.inner.close(chunks)
        finally:
            self.finished = self.inner.finished
            self._chunks(chunks, out)

    @abstractmethod
    def _chunks(self, chunks: list[Any], out: list[Any]) -> None:
        """Chat chunks → this endpoint's pieces, appended to ``out``."""

    @property
    def complete(self) -> bool:
        return self.inner.complete

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        return self.inner.reported()

    def generated(self) -> str:
        return self.inner.generated()


class Leg(ABC):
    """One call for one candidate model, in that model's wire protocol."""

    __slots__ = ("model", "model_id", "upstream")

    def __init__(self, model: Model, model_id: str, upstream: UpstreamRequest) -> None:
        self.model = model
        self.model_id = model_id  # as the caller (or its fallback list) wrote it; echoed back
        self.upstream = upstream

    @property
    @abstractmethod
    def prompt(self) -> dict[str, Any]:
        """The prompt, chat-shaped (messages, tools, response_format), to estimate its tokens."""

    @abstractmethod
    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError: ...

    @abstractmethod
    def answer(self, payload: bytes) -> Answer:
        """The upstream's non-stream body → the caller's answer."""

    @abstractmethod
    def generated(self, body: dict[str, Any]) -> str:
        """The text of an answer (to estimate its tokens when the upstream gave no usage)."""

    @abstractmethod
    def reader(self) -> Reader: ...

    def price(self, body: dict[str, Any], cost: Cost) -> None:
        """Put ``cost`` into the answer ``body`` (chat: ``usage.cost``)."""
        usage = body.get("usage")
        if isinstance(usage, msgspec.Raw):  # a plain answer's (non-empty, no ``cost``: Adapter.plain_answer)
            body["usage"] = msgspec.Raw(bytes(usage)[:-1] + b',"cost":' + cost.text.encode() + b"}")
        else:
            body["usage"] = chat_priced(usage, cost)


class ChatBackedLeg(Leg):
    """A leg answered by a chat leg (``inner``) and written in another endpoint's shape (a translated
    Responses or Messages call): the prompt and the errors are the chat leg's; :meth:`translate` turns
    its answer."""

    __slots__ = ("inner",)

    def __init__(self, inner: Leg) -> None:
        super().__init__(inner.model, inner.model_id, inner.upstream)
        self.inner = inner

    @property
    def prompt(self) -> dict[str, Any]:
        return self.inner.prompt

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        return self.inner.error(status, body, headers)

    def answer(self, payload: bytes) -> Answer:
        completion = self.inner.answer(payload)
        return Answer(self.translate(completion.body), completion.usage)

    @abstractmethod
    def translate(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The chat completion → this endpoint's answer."""


class WholeLeg(Leg):
    """A leg of an endpoint that does not stream (embeddings, images): the provider's errors are
    mapped by its adapter (``map_error``), and its answer has no text to estimate tokens from."""

    __slots__ = ("map_error",)

    def __init__(
        self,
        model: Model,
        model_id: str,
        upstream: UpstreamRequest,
        map_error: Callable[[int, bytes, Mapping[str, str]], GatewayError],
    ) -> None:
        super().__init__(model, model_id, upstream)
        self.map_error = map_error

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        return self.map_error(status, body, headers)

    def generated(self, body: dict[str, Any]) -> str:
        return ""

    def reader(self) -> Reader:
        raise NotImplementedError(f"{type(self).__name__} does not stream")


class Codec(ABC):
    """One call as its endpoint received it."""

    endpoint: Endpoint
    image_param = "messages"  # the field a 400 about images names
    cap_param = "max_tokens"  # the field a 400 about the output cap names
    clamp_cap = False  # an output cap over the model's ceiling is lowered to it (else a 400)

    def __init__(self, view: ChatRequest, size: int, stream: bool, models: list[str]) -> None:
        self.view = view  # chat-shaped: model, images, output cap (checks, rate limits, worst case)
        self.size = size  # an upper bound of the prompt's bytes (the body's, or the expanded conversation's)
        self.stream = stream
        self.models = models  # the request's own fallbacks (``models``), after its model

    @abstractmethod
    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> Leg:
        """The call for one candidate model on one of its provider's deployments (pure; a
        GatewayError if this model cannot take it)."""

    def deployments(self, gw: Gateway, model: Model) -> tuple[Deployment, ...]:
        """The deployments that may serve this call of ``model`` (gateway/dispatch.py picks)."""
        return gw.dispatcher.pools[model.provider].serving(model, self.endpoint)

    @abstractmethod
    def conversation(self, key_id: int, first: int) -> bytes:
        """What names this call's conversation for sticky routing: the request as the caller sent it
        to :func:`gateway.routing.conversation`."""


def fallback_list(body: dict[str, Any]) -> list[str]:
    """The request's own ``models`` list (as OpenRouter accepts it), taken out of ``body`` with
    ``route``: they are ours, never sent upstream."""
    extra = body.pop("models", None)
    body.pop("route", None)
    if extra is None:
        return []
    if not isinstance(extra, list) or not all(isinstance(m, str) for m in extra) or len(extra) > 8:
        raise InvalidRequest(
            "'models' must be a list of at most 8 model ids.", param="models", code="invalid_value"
        )
    return extra
