"""The chat stream: upstream SSE bytes → adapter chunks → one normalised OpenAI chunk stream (the
chat codec's :class:`~gateway.codec.Reader`, relayed by :mod:`gateway.relay`).

Whatever the provider, the caller sees: a first chunk with ``delta.role``, text (and tool-call, and
``reasoning_content``) chunks, exactly one chunk per choice whose ``finish_reason`` is set and whose
delta is empty, then (only if asked with ``stream_options.include_usage``) one usage chunk with
``choices: []``, then ``data: [DONE]``. Every chunk carries the gateway's completion id and the model
id the caller sent (not when the chunks become another endpoint's events, ``Shaper(..., stamp=False)``:
those read only the choices, the usage and an error). An upstream failure after the first byte becomes one ``data: {"error": ...}``
event followed by ``data: [DONE]``.

The common chunk of an OpenAI-protocol upstream (one choice, text only) is already in that shape: for
the chat endpoint (``ChatReader(..., raw=True)``) it is passed through as bytes with only its head (id,
object, created, model) swapped for ours and its ``usage`` key kept or dropped as the caller asked
(:meth:`Shaper.pass_through`); any other chunk goes through the translator and :meth:`Shaper.shape`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from adapters.base import Call, StreamTranslator
from core.errors import GatewayError
from core.sse import DONE, SSEDecoder, frame
from core.templates import HOLES, INTS, formatting, hole, template
from core.wire import TokenUsage
from gateway.codec import Reader, chat_priced
from gateway.relay import LastBatch

_encode = msgspec.json.Encoder().encode


class _Delta(msgspec.Struct, forbid_unknown_fields=True):
    role: str | None = None
    content: str | None = None


class _Choice(msgspec.Struct, forbid_unknown_fields=True):
    delta: _Delta
    index: int = 0
    finish_reason: str | None = None
    logprobs: msgspec.Raw | None = None


class _Plain(msgspec.Struct):
    """An upstream OpenAI chunk that may pass through: text only (other fields fail to decode), no
    usage; unknown top-level fields are not decoded and pass through as bytes."""

    id: str
    object: str
    created: int
    model: str
    choices: list[_Choice]
    usage: None = None


_decode_plain = msgspec.json.Decoder(_Plain).decode
_decode_text = msgspec.json.Decoder(str).decode


def chunk(completion_id: str, created: int, model: str, choices: Any) -> dict[str, Any]:
    """A chunk as the caller gets it, up to its choices (key order as Shaper._stamp builds one; the
    fields of the upstream's chunk follow, then usage if asked for: null but in the usage chunk)."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }


# the bytes written around a chunk's values, derived from chunk() at import (core/templates.py): its
# head (_chunk_head: a %-format of the id, created and model), the choices' key, and its end after the
# choices when usage is asked for (_NO_USAGE, also how an upstream's chunk that may pass through ends)
_ID, _CREATED, _MODEL, _CHOICES_KEY, _NO_USAGE = template(
    _encode({**chunk(HOLES[0], INTS[0], HOLES[1], HOLES[2]), "usage": None}),
    hole(HOLES[0]),
    hole(INTS[0]),
    hole(HOLES[1]),
    hole(HOLES[2]),
)
_HEAD = formatting((_ID, _CREATED, _MODEL, b""), b"%b", b"%d", b"%b")
_CHOICES = _CHOICES_KEY + b"["  # (the choices are a list)
# the SSE frames of several data events: b"data: " + b"\n\ndata: ".join(chunks) + b"\n\n"
_FIRST, _LAST = template(frame(hole(HOLES[0])), hole(HOLES[0]))
_BETWEEN = _LAST + _FIRST
# A text chunk of choice 0 after its first (Shaper._text_chunk): its head and the fields the stream's
# chunks carry between the model and the choices (OpenAI's service_tier, system_fingerprint), then
# this, the content, one of the choice's ends (what OpenAI and the OpenAI-compatible providers send),
# and flat fields after the choices (OpenAI's obfuscation; usage null first, or no usage).
_TEXT_OPEN = _CHOICES + b'{"index":0,"delta":{"content":'
_CHOICE_ENDS = (
    b'},"logprobs":null,"finish_reason":null}]',
    b'},"finish_reason":null,"logprobs":null}]',
    b'},"finish_reason":null}]',
)
_TEXT_CLOSE = b'},"'  # how the delta object ends (never inside a JSON string: its quotes are escaped)
_USAGE_NULL = b',"usage":null'


def _tail(tail: bytes) -> tuple[bytes, bytes] | None:
    """A text chunk's bytes from the end of its delta: (the choice's end, the flat fields after the
    choices but usage null), or None if it is not one of ``_CHOICE_ENDS`` then flat fields."""
    for end in _CHOICE_ENDS:
        if tail.startswith(end):
            break
    else:
        return None
    rest = tail[len(end) : -1]
    if tail[-1:] != b"}" or rest.find(b"{") >= 0 or rest.find(b"[") >= 0:
        return None
    if rest.startswith(_USAGE_NULL):
        rest = rest[len(_USAGE_NULL) :]
    return None if b'"usage"' in rest else (end, rest)


# the tails without fields after the choices, found by one look-up
_TAILS = {end + after: (end, b"") for end in _CHOICE_ENDS for after in (_USAGE_NULL + b"}", b"}")}
_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
_CUT = -len(_NO_USAGE)


def _chunk_head(completion_id: str, created: int, model: str) -> bytes:
    """How a compact chat.completion.chunk begins, up to its model: ours, or an upstream's."""
    return _HEAD % (
        _encode(completion_id),
        created,
        _encode(model),
    )


class Shaper:
    """Normalises adapter chunks into the order and shape the caller is promised."""

    __slots__ = (
        "call",
        "completion_id",
        "created",
        "finished",
        "role_sent",
        "said",
        "stamp",
        "_head",
        "_upstream",
        "_usage",
        "_text_head",
        "_between",
    )

    def __init__(self, call: Call, completion_id: str, created: int, stamp: bool = True) -> None:
        self.call = call
        # the chunks get our id, the caller's model id and one key order (:meth:`_stamp`); not when
        # another endpoint's events are made of them (gateway.codec.ChatWrapper: they read the choices,
        # the usage and an error only)
        self.stamp = stamp
        self.completion_id = completion_id
        self.created = created
        # the choices that have had their finish chunk / their role: tuples (a set is 216 bytes even with
        # one index in it, and a stream almost always has one choice)
        self.finished: tuple[int, ...] = ()
        self.role_sent: tuple[int, ...] = ()
        self.said = bytearray()  # the answer's text as a JSON string's body: to estimate usage if none comes
        self._head = _chunk_head(completion_id, created, call.model_id)
        self._upstream: tuple[Any, bytes] = (None, b"")  # (id, created, model) of the last chunk, its head
        self._usage = call.include_usage
        self._text_head: bytes | None = None  # how a text chunk of choice 0 begins, once one has come
        self._between = b""  # the fields of that chunk between its model and its choices (flat)

    def pass_through(self, data: bytes) -> bytes | None:
        """The upstream OpenAI chunk ``data`` as the caller's chunk (JSON bytes), if it is already in
        the promised shape (what :meth:`shape` and :meth:`_stamp` would give, key order included),
        else None. Its head is swapped for ours; the rest of its bytes pass through."""
        text_head = self._text_head
        if text_head is not None and data.startswith(text_head):
            piece = self._text_chunk(data, len(text_head))
            if piece is not None:
                return piece
        try:
            chunk = _decode_plain(data)
        except msgspec.DecodeError:  # not a plain text chunk (or not JSON): the general path says
            return None
        choices = chunk.choices
        if len(choices) != 1:
            return None
        choice = choices[0]
        delta, index, reason = choice.delta, choice.index, choice.finish_reason
        if index in self.finished or (delta.role is None and index not in self.role_sent):
            return None
        if reason is not None and (reason not in _FINISH or delta.role is not None or delta.content):
            return None  # a finish chunk to split, or a finish reason to map
        key = (chunk.id, chunk.created, chunk.model)  # the same for every chunk of a stream, as a rule
        if key != self._upstream[0]:
            if chunk.object != "chat.completion.chunk":
                return None
            self._upstream = (key, _chunk_head(chunk.id, chunk.created, chunk.model))
        head = self._upstream[1]
        n = len(head)
        if not data.startswith(head):
            return None
        if not data.startswith(_CHOICES, n):
            # fields between the model and the choices (_stamp moves them after the choices): the general
            # path shapes this chunk; the next text chunks of choice 0 may take the short way, which
            # moves them (only flat ones: no object or array that could hide the choices' key)
            between = data[n : data.find(_CHOICES, n)]
            flat = between and between.find(b"{") < 0 and between.find(b"[") < 0
            if index == 0:
                self._text_head = head + between + _TEXT_OPEN if flat and reason is None else None
                self._between = between
            return None
        if b'"finish_reason"' not in data:  # the general path adds the key: not as promised
            return None
        if data.endswith(_NO_USAGE):  # usage last (where _stamp puts it), and null
            body = data[n:] if self._usage else data[n:_CUT] + b"}"
        elif b'"usage"' in data:
            return None
        else:
            body = data[n:-1] + _NO_USAGE if self._usage else data[n:]
        if index not in self.role_sent:
            self.role_sent += (index,)
        if reason is not None:
            self.finished += (index,)
        if index == 0:  # the next text chunks of choice 0 may take the short way (none after its finish)
            self._text_head = None if reason is not None else head + _TEXT_OPEN
            self._between = b""
        if delta.content:
            self._text(delta.content)
        return self._head + body

    def _text_chunk(self, data: bytes, start: int) -> bytes | None:
        """:meth:`pass_through` of a chunk that begins as the last text chunk of choice 0 did, up to its
        content, without decoding the chunk: what the general path gives (the fields between model and
        choices moved after them, usage null last if asked for). None if the content is not one JSON
        string or the rest is not as :func:`_tail` wants it."""
        if 0 in self.finished or 0 not in self.role_sent:
            return None
        close = data.find(_TEXT_CLOSE, start)
        if close < 0:
            return None
        tail = data[close:]
        parts = _TAILS.get(tail) or _tail(tail)
        if parts is None:
            return None
        text = data[start:close]
        try:
            content = _decode_text(text)
        except msgspec.DecodeError:  # not a string (or not one JSON value)
            return None
        if text[:1] == b'"' == text[-1:]:  # one JSON string, nothing around it: its body as it is
            self.said += memoryview(text)[1:-1]
        else:
            self._text(content)
        return b"".join(
            (
                self._head,
                _TEXT_OPEN,
                text,
                parts[0],
                self._between,
                parts[1],
                _NO_USAGE if self._usage else b"}",
            )
        )

    def _stamp(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """The chunk with our id, the caller's model id and the same key order whatever the provider."""
        out = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.call.model_id,
            "choices": chunk["choices"],
        }
        for name, value in chunk.items():
            if name not in out and name != "usage":
                out[name] = value
        if self.call.include_usage:
            out["usage"] = None
        return out

    def shape(self, chunk: dict[str, Any], out: list[dict[str, Any]]) -> None:
        choices = chunk.get("choices")
        if not choices:
            return  # usage-only or empty chunks: usage is re-emitted at the end
        ready: list[dict[str, Any]] = []
        for choice in choices:
            index = choice.get("index", 0)
            if index in self.finished:
                continue  # nothing may follow a choice's finish chunk
            delta = choice.get("delta") or {}
            choice["delta"] = delta
            if index not in self.role_sent:
                self.role_sent += (index,)
                delta.setdefault("role", "assistant")
            self._keep(delta)
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finished += (index,)
                rest = {k: v for k, v in delta.items() if v not in (None, "")}
                if rest:  # split: the finish chunk carries an empty delta
                    ready.append({**chunk, "choices": [{**choice, "delta": delta, "finish_reason": None}]})
                ready.append({**chunk, "choices": [{**choice, "delta": {}, "finish_reason": reason}]})
            else:
                choice.setdefault("finish_reason", None)
                ready.append({**chunk, "choices": [choice]} if len(choices) > 1 else chunk)
        if self.stamp:
            for item in ready:
                out.append(self._stamp(item))
        else:
            out += ready

    def _keep(self, delta: dict[str, Any]) -> None:
        for field in ("content", "reasoning_content"):
            text = delta.get(field)
            if isinstance(text, str) and text:
                self._text(text)
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            function, custom = call.get("function"), call.get("custom")  # custom: OpenAI's free-form tools
            if isinstance(function, dict):
                self._text(str(function.get("name") or "") + str(function.get("arguments") or ""))
            elif isinstance(custom, dict):
                self._text(str(custom.get("name") or "") + str(custom.get("input") or ""))

    def _text(self, text: str) -> None:
        """Keep ``text`` for :meth:`generated`, in :attr:`said`: one buffer that grows, where a piece of
        text per token (a str object each, ~50 bytes of header for a token or two) made an open
        stream's memory grow with every token it relayed. A text chunk on the short way adds its JSON
        string's body undecoded; here ``text`` is encoded as one."""
        try:
            self.said += memoryview(_encode(text))[1:-1]
        except UnicodeEncodeError:  # a lone surrogate (no UTF-8 for it): counted as a "?"
            self.said += memoryview(_encode(text.encode("utf-8", "replace").decode()))[1:-1]

    def generated(self) -> str:
        """Everything the answer contained so far (to estimate its tokens if no usage ever comes)."""
        return _decode_text(b'"' + self.said + b'"')

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        out = chunk(self.completion_id, self.created, self.call.model_id, [])
        out["usage"] = usage
        return out


def error_chunk(exc: GatewayError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.type, "param": None, "code": exc.code}}


class ChatReader(Reader):
    """An upstream stream (any adapter's translator) → the caller's chat chunks, in the promised
    order (:class:`Shaper`). ``raw``: the consumer only encodes them, so a plain OpenAI chunk may be
    passed on as the ``bytes`` of its JSON (:meth:`Shaper.pass_through`)."""

    __slots__ = ("call", "translator", "shaper", "decoder", "fast")

    def __init__(self, call: Call, translator: StreamTranslator, shaper: Shaper, raw: bool) -> None:
        self.call = call
        self.translator = translator
        self.shaper = shaper
        self.decoder = SSEDecoder()
        self.fast = raw and translator.passthrough

    def feed(self, data: bytes, out: list[Any]) -> None:
        shaper, translator, fast = self.shaper, self.translator, self.fast
        for event in self.decoder.feed(data):
            if fast:
                piece = shaper.pass_through(event.data)
                if piece is not None:
                    out.append(piece)
                    continue
            for chunk in translator.feed(event):
                shaper.shape(chunk, out)
        self.finished = translator.finished

    def close(self, out: list[Any]) -> None:
        for event in self.decoder.close():
            for chunk in self.translator.feed(event):
                self.shaper.shape(chunk, out)
        self.finished = self.translator.finished

    @property
    def complete(self) -> bool:
        return bool(self.shaper.finished)  # a finish chunk came (the upstream may end without [DONE])

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        return self.translator.usage, self.translator.prompt_usage

    def end(self) -> list[Any]:
        translator, cost = self.translator, self.cost
        if not self.call.include_usage:
            return []
        if translator.usage is not None:
            usage = translator.usage_raw if translator.usage_raw is not None else translator.usage.openai()
            return [self.shaper.usage_chunk(usage if cost is None else chat_priced(usage, cost))]
        if cost is not None:  # no usage came: the counts charged (an estimate), with their cost
            return [self.shaper.usage_chunk(chat_priced(None, cost))]
        return []

    def fail(self, exc: GatewayError) -> list[Any]:
        return [error_chunk(exc)]

    def generated(self) -> str:
        return self.shaper.generated()


async def sse(batches: AsyncGenerator[list[Any], None]) -> AsyncGenerator[bytes, None]:
    """Chat chunks (dicts, or their JSON as ``bytes``) as the SSE bytes of the chat protocol, ending with
    ``data: [DONE]``."""
    try:
        async for batch in batches:
            # b"data: " + chunk + b"\n\n" per chunk, in one join
            data = (
                _FIRST + _BETWEEN.join([c if c.__class__ is bytes else _encode(c) for c in batch]) + _LAST
                if batch
                else b""
            )
            if isinstance(batch, LastBatch):
                yield data + DONE  # the last batch and the end in one write
                return
            yield data
        yield DONE
    finally:
        await batches.aclose()
