"""Aggregates of the usage records for the console's overview and breakdowns, on both stores, fast at
millions of records.

- :meth:`Analysis.totals`: calls (failed, rejected), credits and tokens of a filter, grouped by any of
  ``hour``, ``group_id``, ``key_id``, ``model``, ``provider``, ``endpoint``, ``source``. A filter on
  those fields alone is answered from the hourly rollup (billing/rollup.py) for the whole hours of its
  period, and from the ``usage`` table for the rest: the records above the rollup's watermark and the
  partial hours at the period's ends. Any other filter (status, stream, user, ...) reads the records
  (index ranges, billing/usage_filter.py).
- :meth:`Analysis.latency`: percentiles of the latency and the time to first token of the calls
  answered: exact when the period has at most ``EXACT`` of them, else from a sample of ``SAMPLE``
  calls, each the first matching record at or after a random id of the period's range (an index
  seek each).
- :meth:`Analysis.models_used`, :meth:`Analysis.last_used`: the models a group called, and when each
  key was last used.
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from billing.history import History
from billing.rollup import COUNTS, LEVELS, RAW_COUNTS, ROLLED_COUNTS, Level, Rollup, hour_of
from billing.usage_filter import Filter, where

EXACT = 20_000  # calls read one by one for exact percentiles; above, a sample
SAMPLE = 1_000
Key = tuple[Any, ...]


@dataclass(slots=True)
class Totals:
    calls: int = 0
    errors: int = 0  # failed after their reservation (error, interrupted)
    rejected: int = 0  # refused before it
    credits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, values: Any) -> None:
        for name, value in zip(COUNTS, values, strict=True):
            setattr(self, name, getattr(self, name) + int(value or 0))

    def merge(self, other: Totals) -> None:
        self.add(getattr(other, name) for name in COUNTS)

    @property
    def ok(self) -> int:
        return self.calls - self.errors - self.rejected

    @property
    def error_rate(self) -> float:
        """Failed or rejected calls per call (0 without calls)."""
        return (self.errors + self.rejected) / self.calls if self.calls else 0.0


@dataclass(frozen=True, slots=True)
class Percentiles:
    count: int  # calls the figures are about
    read: int  # calls read: all of them (exact), or a sample
    exact: bool
    latency: dict[int, float] = field(default_factory=dict)  # percentile -> milliseconds
    ttft: dict[int, float] = field(default_factory=dict)  # of the streamed calls


def percentile(values: list[float], p: int) -> float:
    """The ``p``-th percentile (nearest rank) of sorted ``values``."""
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


Span = tuple[Level | None, float | None, float | None]


def plan(since: float | None, until: float | None, levels: list[Level]) -> list[Span]:
    """``[since, until)`` cut into the whole periods of the coarsest of ``levels`` that fit, then of
    the next ones for what is left at either end, and what is left after the finest (``None``: read
    from the records). An open end stays open (the rollups hold nothing beyond their watermark)."""
    if since is not None and until is not None and since >= until:
        return []
    if not levels:
        return [(None, since, until)]
    level, rest = levels[0], levels[1:]
    width = level.width
    start = math.ceil(since / width) * width if since is not None else None
    end = math.floor(until / width) * width if until is not None else None
    if start is not None and end is not None and start >= end:
        return plan(since, until, rest)
    head = plan(since, start, rest) if start is not None and since is not None and start > since else []
    tail = plan(end, until, rest) if end is not None and until is not None and end < until else []
    return [*head, (level, start, end), *tail]


class Analysis:
    def __init__(self, history: History) -> None:
        self.history = history
        self.db = history.db
        self.sqlite = history.sqlite
        self.rollup = Rollup(history)

    # -- totals -----------------------------------------------------------------------------------
    async def totals(self, f: Filter, by: tuple[str, ...] = ()) -> dict[Key, Totals]:
        """The totals of ``f`` per distinct value of the ``by`` fields (``()``: one total)."""
        out: dict[Key, Totals] = {}
        fields = f.given()
        levels = [level for level in LEVELS if level.answers(fields, by)]
        if not levels:
            await self._raw(f, by, None, None, out)
            return out
        rolled = await self.rollup.fresh()
        for level, since, until in plan(f.since, f.until, levels):
            part = replace(f, since=since, until=until)
            if level is None:
                await self._raw(part, by, None, rolled + 1, out)  # partial periods: the records
            else:
                await self._rolled(level, part, by, out)
        await self._raw(f, by, rolled + 1, None, out)  # above the watermark: the records
        return out

    async def total(self, f: Filter) -> Totals:
        return (await self.totals(f)).get((), Totals())

    async def _rolled(self, level: Level, f: Filter, by: tuple[str, ...], out: dict[Key, Totals]) -> None:
        clauses: list[str] = []
        args: list[Any] = []
        for clause, value in (("period >= ?", f.since), ("period < ?", f.until)):
            if value is not None:
                clauses.append(clause)
                args.append(int(value))
        for name in level.dims:
            value = getattr(f, name)
            if value is not None:
                clauses.append(f"{name} = ?")
                args.append(value)
        if f.models is not None:
            clauses.append(f"model IN ({', '.join('?' * len(f.models))})" if f.models else "1 = 0")
            args.extend(f.models)
        sql = f"SELECT {_select(by, 'period')}{ROLLED_COUNTS} FROM {level.table}"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        _collect(await self.db.select(sql + _group(by), args), len(by), out)

    async def _raw(
        self, f: Filter, by: tuple[str, ...], lo: int | None, hi: int | None, out: dict[Key, Totals]
    ) -> None:
        """Add the totals of the records of ``f`` with ids in ``[lo, hi)`` to ``out``."""
        first, last = await self.history.id_range(f.since, f.until)
        lo, hi = _tighter(lo, first, max), _tighter(hi, last, min)
        if lo is not None and hi is not None and lo >= hi:
            return
        hour = hour_of(self.sqlite)
        for a, b in await self.history.windows(lo, hi):
            base, args = where(f, a, b, self.sqlite)
            sql = f"SELECT {_select(by, hour)}{RAW_COUNTS} {base}{_group(by)}"
            _collect(await self.db.select(sql, args), len(by), out)
            await asyncio.sleep(0)

    # -- percentiles ------------------------------------------------------------------------------
    async def latency(self, f: Filter, answered: int, points: tuple[int, ...] = (50, 90, 99)) -> Percentiles:
        """Percentiles of the latency (and of the time to first token, of streams) of the calls of
        ``f`` answered ``ok``; ``answered``: how many there are (from :meth:`totals`)."""
        ok = replace(f, status="ok")
        lo, hi = await self.history.id_range(ok.since, ok.until)
        exact = answered <= EXACT
        rows = await (self._all(ok, lo, hi) if exact else self._sample(ok, lo, hi))
        latency = sorted(float(r[0]) for r in rows)
        ttft = sorted(float(r[1]) for r in rows if r[1] is not None)
        return Percentiles(
            len(rows) if exact else answered,
            len(rows),
            exact,
            {p: percentile(latency, p) for p in points} if latency else {},
            {p: percentile(ttft, p) for p in points} if ttft else {},
        )

    async def _all(self, f: Filter, lo: int | None, hi: int | None) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for a, b in await self.history.windows(lo, hi):
            base, args = where(f, a, b, self.sqlite)
            rows += await self.db.select(f"SELECT latency_ms, ttft_ms {base}", args)
        return rows

    async def _sample(self, f: Filter, lo: int | None, hi: int | None) -> list[tuple[Any, ...]]:
        bounds = await self.db.select("SELECT (SELECT min(id) FROM usage), (SELECT max(id) FROM usage)")
        first, last = bounds[0]
        if first is None:
            return []
        lo = max(lo or first, first)
        hi = min(hi if hi is not None else last + 1, last + 1)
        if lo >= hi:
            return []
        seed = zlib.crc32(repr((f, lo, hi)).encode())  # the same sample for the same question: stable figures
        rng = random.Random(seed)  # noqa: S311 (a sample of rows, seeded on purpose: not a secret)
        pivots = sorted(rng.randrange(lo, hi) for _ in range(SAMPLE))
        base, args = where(f, None, hi, self.sqlite)
        seek = f"SELECT id {base} AND id >= p ORDER BY id LIMIT 1"
        if self.sqlite:
            marks = ", ".join("(?)" for _ in pivots)
            sql = (
                f"WITH v(p) AS (VALUES {marks}) SELECT u.latency_ms, u.ttft_ms FROM v "
                f"JOIN usage u ON u.id = ({seek})"
            )
            return await self.db.select(sql, (*pivots, *args))
        sql = f"SELECT u.latency_ms, u.ttft_ms FROM unnest(?::int8[]) AS v(p) JOIN usage u ON u.id = ({seek})"
        return await self.db.select(sql, (pivots, *args))

    # -- lists ------------------------------------------------------------------------------------
    async def models_used(self, group_id: int | None) -> list[str]:
        """The models a group (or any group) has called, most called first."""
        totals = await self.totals(Filter(group_id), ("model",))
        return [m for (m,), _ in sorted(totals.items(), key=lambda kv: (-kv[1].calls, kv[0][0])) if m]

    async def batches(self, ids: list[str]) -> dict[str, Totals]:
        """The totals of the calls of each of these batches so far: kept per batch up to the rollups'
        watermark (``usage_batch_totals``, moved forward here over the records the watermark passed
        since), plus the batch's records above it, read from ``usage``. A page of batches costs the
        same whatever their sizes: a finished batch is one kept row."""
        if not ids:
            return {}
        rolled = await self.rollup.fresh()
        marks = ", ".join("?" * len(ids))
        kept = {
            str(r[0]): (int(r[1]), r[2:])
            for r in await self.db.select(
                f"SELECT batch_id, upto, {', '.join(COUNTS)} FROM usage_batch_totals WHERE batch_id IN ({marks})",
                ids,
            )
        }
        source = "usage INDEXED BY usage_batch" if self.sqlite else "usage"
        out: dict[str, Totals] = {}
        for batch_id in ids:
            upto, counts = kept.get(batch_id, (0, ()))
            totals = Totals()
            if counts:
                totals.add(counts)
            if upto < rolled:  # the records the watermark passed since: kept from now on
                (row,) = await self.db.select(
                    f"SELECT {RAW_COUNTS} FROM {source} WHERE batch_id = ? AND id > ? AND id <= ?",
                    (batch_id, upto, rolled),
                )
                if row[0]:  # (none: nothing to keep; the empty range is as cheap to read again)
                    totals.add(row)
                    await self.db.write(_KEEP, (batch_id, rolled, *(getattr(totals, c) for c in COUNTS)))
            (tail,) = await self.db.select(
                f"SELECT {RAW_COUNTS} FROM {source} WHERE batch_id = ? AND id > ?",
                (batch_id, max(upto, rolled)),
            )
            if tail[0]:
                totals.add(tail)
            if totals.calls:
                out[batch_id] = totals
        return out

    async def last_used(self, key_ids: list[int]) -> dict[int, float]:
        """When each of these keys was last used (keys never used are left out)."""
        if not key_ids:
            return {}
        marks = ", ".join("?" * len(key_ids))
        latest = "(SELECT ts FROM usage u WHERE u.key_id = k.id ORDER BY u.id DESC LIMIT 1)"
        rows = await self.db.select(f"SELECT k.id, {latest} FROM keys k WHERE k.id IN ({marks})", key_ids)
        return {int(k): float(ts) for k, ts in rows if ts is not None}


# a batch's kept totals moved forward; two readers at once: the one that got further wins, either is right
_KEEP = (
    f"INSERT INTO usage_batch_totals (batch_id, upto, {', '.join(COUNTS)}) VALUES (?, ?, {', '.join('?' * len(COUNTS))}) "
    f"ON CONFLICT (batch_id) DO UPDATE SET upto = excluded.upto, "
    f"{', '.join(f'{c} = excluded.{c}' for c in COUNTS)} WHERE usage_batch_totals.upto < excluded.upto"
)


def _tighter(a: int | None, b: int | None, pick: Any) -> int | None:
    return b if a is None else a if b is None else pick(a, b)


def _select(by: tuple[str, ...], hour: str) -> str:
    return "".join(f"{hour if name == 'hour' else name}, " for name in by)


def _group(by: tuple[str, ...]) -> str:
    return " GROUP BY " + ", ".join(str(i) for i in range(1, len(by) + 1)) if by else ""


def _collect(rows: list[tuple[Any, ...]], width: int, out: dict[Key, Totals]) -> None:
    for row in rows:
        if row[width] == 0 or row[width] is None:  # no records (an aggregate without GROUP BY)
            continue
        out.setdefault(tuple(row[:width]), Totals()).add(row[width:])
