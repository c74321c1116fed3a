"""The usage so far of the streams in flight, kept in the store every ``every`` seconds, so a stream cut
by a crash is charged for what it generated up to its last checkpoint (docs/operations.md, "Faults").

    stream starts ──► followed ──every s──► a checkpoint ──► the store: the tokens it generated so far;
          │                                 how to charge it (once, and when a reported usage changes)
          │                                   SQLite: its ``in_progress`` row, in the group commit
          │                                   PostgreSQL: the ``progress`` columns of its reservation row
          ▼
    settled (normally): the row goes in the settlement's own transaction; nothing is charged twice
    the process dies: SQLite charges each row at the next start, PostgreSQL's lease release
                      (billing/leases.py) charges the row of each hold it releases: :func:`charged`

A checkpoint keeps counts, never a call's content: the tokens of the text the stream added since its
last checkpoint are counted then and added to its count, and its prompt's tokens are counted with its
first checkpoint unless the upstream reported them (a usage the upstream reported is taken as it is).
Counting a part apart from the text before it may find a token more where the part begins (at most
one a checkpoint: a charge that is an estimate anyway). A slice of streams with more than ``INLINE``
characters to count is counted on a worker thread, so no prompt holds the event loop. The charge is
the model's prices on that usage, capped at the call's reservation.

A stream shorter than ``every`` never reaches the store: a call pays two dictionary operations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Protocol

import msgspec

from billing import tokens
from billing.pricing import cost
from billing.store import Checkpoint, Reservation, Store, UsageRecord, record_of
from core.catalog import Model, Prices
from core.wire import TokenUsage

log = logging.getLogger("router.ledger")
CUT = "the gateway stopped during this stream; charged for what it generated up to its last checkpoint"


class Source(Protocol):
    """What a stream's reader tells of its progress (gateway/codec.py ``Reader``)."""

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]: ...

    def generated(self) -> str: ...


class Meter(Protocol):
    """What a checkpoint reads of a call (billing.ledger.Meter)."""

    reservation: Reservation
    model: Model
    record: UsageRecord
    prompt: dict[str, Any]
    started: float
    finished: bool


class Charge(msgspec.Struct, array_like=True):
    """How a cut stream is charged, as its checkpoints keep it (a JSON array): its call's record as it
    stood (its fields in order), when it began (wall clock), its reservation (the cap) and model's
    prices, and the usage the upstream reported, if any: else its prompt's (reported or counted).
    ``prompt``, the prompt's texts, is only ever in a charge kept before checkpoints kept counts."""

    record: tuple[Any, ...]
    began: float
    cap: int
    prices: Prices
    usage: TokenUsage | None = None
    prompt_usage: TokenUsage | None = None
    prompt: tuple[int, list[str]] | None = None


_charge_json = msgspec.json.Encoder()
_charge_of = msgspec.json.Decoder(Charge)


def charged(charge: str | bytes, completion: int, at: float | None, text: str = "") -> UsageRecord:
    """The ``interrupted`` record of a stream cut after its last checkpoint (one rule for both stores),
    from what its checkpoints kept: ``charge`` (a :class:`Charge`; or a whole record, as checkpoints
    kept one before: as it is), the tokens it generated (and ``text``, what a process before this one
    kept instead), and when (wall clock) the last checkpoint was. Its usage is the upstream's, if it
    reported one; charged at the model's prices, capped at its reservation."""
    try:
        kept = _charge_of.decode(charge)
    except msgspec.ValidationError:  # (a record as it is)
        return record_of(charge)
    record = UsageRecord(*kept.record)
    usage = kept.usage
    if usage is None:
        prompt = kept.prompt_usage
        if prompt is None:
            prompt = TokenUsage(prompt=tokens.count_prompt(kept.prompt) if kept.prompt is not None else 0)
        usage = TokenUsage(
            prompt=prompt.prompt,
            cached=prompt.cached,
            cache_write=prompt.cache_write,
            completion=completion + tokens.count(text),
        )
    record.prompt_tokens, record.completion_tokens = usage.prompt, usage.completion
    record.cached_tokens, record.cache_write_tokens, record.reasoning_tokens = (
        usage.cached,
        usage.cache_write,
        usage.reasoning,
    )
    record.credits = min(cost(kept.prices, usage), kept.cap)
    record.status, record.usage_exact, record.error, record.error_code = (
        "interrupted",
        False,
        CUT,
        "interrupted",
    )
    record.ts = at if at is not None else time.time()
    record.latency_ms = max(0.0, record.ts - kept.began) * 1000
    return record


@dataclass(slots=True)
class _Followed:
    meter: Meter
    source: Source
    usage: Any = None  # the usage reported when its Charge was last written (None: never written)
    chars: int = 0  # of the generated text, counted and written
    tokens: int = 0  # of those characters
    due: float = 0.0  # when its next checkpoint is (monotonic)


SLICE = 500  # streams a tick reads and writes at a time (SQLite writes on the event loop's connection)
INLINE = 1 << 16  # characters a slice counts on the event loop (~2 ms); more: on a worker thread


class Progress:
    """The streams in flight of one ledger, and their checkpoints (see the module's docstring). A
    stream's checkpoints are ``every`` seconds apart from its start: ticked more often (``tick_every``),
    the streams' checkpoints spread over the interval as their starts do, rather than all at once."""

    def __init__(self, store: Store, every: float) -> None:
        self.store = store
        self.every = every  # seconds between a stream's checkpoints; 0: none
        self.tick_every = min(every, 1.0)  # seconds between ticks
        self.streams: dict[int, _Followed] = {}  # reservation id -> the stream
        self.noted = 0  # checkpoints written

    def follow(self, meter: Meter, source: Source) -> None:
        if self.every:
            self.streams[meter.reservation.id] = _Followed(meter, source, due=meter.started + self.every)

    def drop(self, reservation: Reservation) -> None:
        if self.streams:
            self.streams.pop(reservation.id, None)

    async def tick(self) -> int:
        """A checkpoint of every stream whose time has come, ``SLICE`` streams a write; how many were
        noted. Each write is awaited before the next slice is read, so the event loop serves calls
        between them rather than holding them for every stream in flight at once (a stream settled
        meanwhile is left out)."""
        now = time.monotonic()
        streams = [f for f in self.streams.values() if now >= f.due]
        noted = 0
        for i in range(0, len(streams), SLICE):
            due = []
            for f in streams[i : i + SLICE]:
                if f.meter.finished:  # (settled while an earlier slice was written: its settlement is queued)
                    continue
                f.due = now + self.every
                text, usage = f.source.generated(), f.source.reported()
                if len(text) != f.chars or usage != f.usage:  # (else its row says as much)
                    due.append((f, text, usage))
            if not due:
                continue
            try:
                noted += await self._write(due)
            except BaseException:
                for f in streams[i:]:  # due again at the next tick
                    f.due = now
                raise
        return noted

    async def _write(self, due: list[tuple[_Followed, str, Any]]) -> int:
        at = time.time()
        work, parts, size = [], [], 0
        for f, text, usage in due:
            # the text it added (unless the upstream reported the usage: then that is charged, as it is);
            # its prompt, with its first charge if nothing reported the prompt's counts
            try:
                prompt = (
                    tokens.prompt_texts(f.meter.prompt)
                    if usage != f.usage and usage == (None, None)
                    else None
                )
            except Exception:  # (one stream's that cannot be made holds back no other's)
                log.exception("stream %s: its checkpoint could not be made", f.meter.reservation.id)
                continue
            added = text[f.chars :] if usage[0] is None else ""
            size += len(added) + (tokens.to_count(prompt[1]) if prompt is not None else 0)
            work.append((f, usage, len(text)))
            parts.append((added, prompt))
        counted = await asyncio.to_thread(_counted, parts) if size > INLINE else _counted(parts)
        rows, written = [], []
        for (f, usage, chars), (tokens_added, prompt_tokens) in zip(work, counted, strict=True):
            meter = f.meter
            if meter.finished:  # (settled while its count was on the worker thread)
                continue
            try:  # its charge again only if it changed (or was never written)
                charge = None if usage == f.usage else _charge(meter, usage, at, prompt_tokens)
            except Exception:
                log.exception("stream %s: its checkpoint could not be made", meter.reservation.id)
                continue
            completion = f.tokens + tokens_added
            rows.append(
                _new(Checkpoint, (meter.reservation.id, meter.record.request_id, charge, completion, at))
            )
            written.append((f, charge, usage, chars, completion))
        if rows:
            await self.store.note_progress(rows)
            for f, charge, usage, chars, completion in written:  # (once written)
                if charge is not None:
                    f.usage = usage
                f.chars, f.tokens = chars, completion
            self.noted += len(rows)
        return len(rows)


_new = tuple.__new__  # (a Checkpoint made without NamedTuple's Python-level constructor)


def _counted(parts: list[tuple[str, tuple[int, list[str]] | None]]) -> list[tuple[int, int | None]]:
    """The tokens of each stream's added text, and of its prompt (when it has one to count)."""
    count, prompt_count = tokens.count, tokens.count_prompt
    return [(count(added), prompt_count(prompt) if prompt is not None else None) for added, prompt in parts]


def _charge(
    meter: Meter, reported: tuple[TokenUsage | None, TokenUsage | None], at: float, prompt_tokens: int | None
) -> str:
    """The stream's :class:`Charge` as JSON (its prompt's tokens as counted if nothing reported them)."""
    usage, prompt = reported
    if usage is None and prompt is None:
        prompt = TokenUsage(prompt=prompt_tokens or 0)
    began = at - (time.monotonic() - meter.started)
    kept = Charge(
        _fields_of(meter.record), began, meter.reservation.amount, meter.model.prices, usage, prompt
    )
    return _charge_json.encode(kept).decode()


_fields_of = attrgetter(*(f.name for f in fields(UsageRecord)))  # in the order its constructor takes them
