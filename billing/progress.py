"""The usage so far of the streams in flight, kept in the store every ``every`` seconds, so a stream cut
by a crash is charged for what it generated up to its last checkpoint (docs/operations.md, "Faults").

    stream starts ──► followed ──every s──► its usage so far (counted on a worker thread) ──► the store
          │                                   SQLite: a row of ``in_progress``, in the group commit
          │                                   PostgreSQL: the ``progress`` of its reservation row
          ▼
    settled (normally): the row goes in the settlement's own transaction; nothing is charged twice
    the process dies: SQLite charges each row at the next start, PostgreSQL's lease release
                      (billing/leases.py) charges the row of each hold it releases

A stream shorter than ``every`` never reaches the store: a call pays two dictionary operations. A
stream's completion is counted on the text it added since its last checkpoint (the tokenizer's
boundary may differ by a token), its prompt once; a usage the upstream already reported is taken as
it is. The charge is the model's prices on that usage, capped at the call's reservation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Protocol

from billing import tokens
from billing.pricing import cost
from billing.store import Reservation, Store, UsageRecord
from core.catalog import Model
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


@dataclass(slots=True)
class _Followed:
    meter: Meter
    source: Source
    prompt: TokenUsage | None = None  # the prompt's count, once made
    chars: int = 0  # of the generated text, counted so far
    completion: int = 0  # its tokens
    kept: tuple[int, Any] | None = None  # what its last checkpoint saw: (text length, upstream usage)
    due: float = 0.0  # when its next checkpoint is (monotonic)


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
        """A checkpoint of every stream whose time has come; how many were noted."""
        now = time.monotonic()
        due = []
        for f in self.streams.values():
            if now < f.due:
                continue
            f.due = now + self.every
            text = f.source.generated()
            seen = (len(text), f.source.reported())
            if seen != f.kept:  # (else nothing new since its last checkpoint: its row says as much)
                due.append((f, text, seen))
        if not due:
            return 0
        try:
            return await self._write(due)
        except BaseException:
            for f, _, _ in due:  # due again at the next tick
                f.due = now
            raise

    async def _write(self, due: list[tuple[_Followed, str, tuple[int, Any]]]) -> int:
        records = await asyncio.get_running_loop().run_in_executor(None, _count, due)
        # (streams settled while their count was made are left out: their settlement is queued already)
        kept = [(f, r) for (f, _, _), r in zip(due, records, strict=True) if not f.meter.finished]
        if kept:
            await self.store.note_progress([(f.meter.reservation, r) for f, r in kept])
            for f, _, seen in due:  # (once written)
                f.kept = seen
            self.noted += len(kept)
        return len(kept)


def _count(due: list[tuple[_Followed, str, tuple[int, Any]]]) -> list[UsageRecord]:
    """The records of ``due`` streams as they stand, each (stream, text, (its length, (usage, prompt
    usage) as reported)) (a worker thread: the tokenizer's work)."""
    return [_record(f, text, usage, prompt) for f, text, (_, (usage, prompt)) in due]


def _record(f: _Followed, text: str, usage: TokenUsage | None, prompt: TokenUsage | None) -> UsageRecord:
    meter = f.meter
    if usage is None:
        if prompt is None:
            if f.prompt is None:
                f.prompt = TokenUsage(prompt=tokens.count_request(meter.prompt))
            prompt = f.prompt
        if len(text) > f.chars:
            f.completion += tokens.count(text[f.chars :])
            f.chars = len(text)
        usage = TokenUsage(prompt=prompt.prompt, cached=prompt.cached, cache_write=prompt.cache_write,
                           completion=f.completion)  # fmt: skip
    record = UsageRecord(*_fields_of(meter.record))  # a copy (dataclasses.replace costs ~5x as much)
    record.prompt_tokens, record.completion_tokens = usage.prompt, usage.completion
    record.cached_tokens, record.cache_write_tokens, record.reasoning_tokens = usage.cached, usage.cache_write, usage.reasoning
    record.credits = min(cost(meter.model.prices, usage), meter.reservation.amount)
    record.status, record.usage_exact, record.error, record.error_code = "interrupted", False, CUT, "interrupted"
    record.latency_ms, record.ts = (time.monotonic() - meter.started) * 1000, time.time()
    return record


_fields_of = attrgetter(*(f.name for f in fields(UsageRecord)))  # in the order its constructor takes them
