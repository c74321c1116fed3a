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
from dataclasses import dataclass, replace
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


class Progress:
    """The streams in flight of one ledger, and their checkpoints (see the module's docstring)."""

    def __init__(self, store: Store, every: float) -> None:
        self.store = store
        self.every = every  # seconds between checkpoints; 0: none
        self.streams: dict[int, _Followed] = {}  # reservation id -> the stream
        self.noted = 0  # checkpoints written (one per stream per tick)

    def follow(self, meter: Meter, source: Source) -> None:
        if self.every:
            self.streams[meter.reservation.id] = _Followed(meter, source)

    def drop(self, reservation: Reservation) -> None:
        if self.streams:
            self.streams.pop(reservation.id, None)

    async def tick(self) -> int:
        """One checkpoint of every stream older than ``every``; how many were noted."""
        now = time.monotonic()
        due = [
            (f, f.source.generated()) for f in self.streams.values() if now - f.meter.started >= self.every
        ]
        if not due:
            return 0
        reported = [f.source.reported() for f, _ in due]
        records = await asyncio.get_running_loop().run_in_executor(None, _count, due, reported)
        # (streams settled while their count was made are left out: their settlement is queued already)
        kept = [
            (f.meter.reservation, r) for (f, _), r in zip(due, records, strict=True) if not f.meter.finished
        ]
        if kept:
            await self.store.note_progress(kept)
            self.noted += len(kept)
        return len(kept)


def _count(due: list[tuple[_Followed, str]],
           reported: list[tuple[TokenUsage | None, TokenUsage | None]]) -> list[UsageRecord]:  # fmt: skip
    """The records of ``due`` streams as they stand (a worker thread: the tokenizer's work)."""
    return [_record(f, text, usage, prompt) for (f, text), (usage, prompt) in zip(due, reported, strict=True)]


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
    return replace(meter.record, prompt_tokens=usage.prompt, completion_tokens=usage.completion,
                   cached_tokens=usage.cached, cache_write_tokens=usage.cache_write, reasoning_tokens=usage.reasoning,
                   credits=min(cost(meter.model.prices, usage), meter.reservation.amount), status="interrupted",
                   usage_exact=False, error=CUT, error_code="interrupted",
                   latency_ms=(time.monotonic() - meter.started) * 1000, ts=time.time())  # fmt: skip
