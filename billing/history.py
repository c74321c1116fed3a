"""Reading the usage records back, for both stores: the CLI's ``router usage``, a key's totals per
model, and the console's call history, chart and CSV export.

- ``usage``: the newest records, filtered by group, key and source.
- ``history``: a group's call history, newest first, filtered by period, model, key and source, one
  page at a time with keyset pagination on ``usage.id`` (``id < before`` / ``id > after``): a page
  costs the same at the millionth row as at the first.
- ``buckets``: calls and credits per time bucket, for the chart.
- ``key_models`` / ``usage_by_model``: one key's usage per model over a period; ``totals``: a
  filter's usage per model or per deployment.

Speed with millions of rows comes from two things. (1) Indexes of billing's schema that end in
``id``, so every filter is an index range read in id order: ``(group_id, id)``, ``(group_id,
source, id)``, ``(group_id, model, id)``, ``(key_id, id)`` (SQLite is told which to use, PostgreSQL's
planner picks). (2) A period becomes an id range: usage ids grow with their timestamps (a record is
written when its call ends, stamped then), so the first id at or after a time is found by binary
search on the primary key (a few dozen point reads). To stay exact despite small disorder (clocks of
several replicas, commit batches), the id range is widened by ``SKEW`` seconds on each side and the
exact ``ts`` test applied inside it.

The SQL is dialect-neutral (``?`` placeholders) on the store's one database handle. On SQLite, which
runs every statement on one thread, aggregates over large ranges are done in id windows of ``CHUNK``
rows so that other work queued on that thread is not held up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from billing.database import Database
from billing.records import USAGE_SELECT, ModelUsage, UsageRecord, usage_record
from billing.usage_filter import Filter, where

__all__ = ["Bucket", "Filter", "History", "Page", "Totals"]

SKEW = 600.0  # seconds of timestamp disorder tolerated between ids
CHUNK = 50_000  # SQLite: ids per aggregate window


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[UsageRecord]
    older: int | None  # ``before`` cursor of the next older page, if there is one
    newer: int | None  # ``after`` cursor of the next newer page, if there is one


@dataclass(frozen=True, slots=True)
class Bucket:
    start: float
    calls: int
    credits: int


@dataclass(frozen=True, slots=True)
class Totals:
    """One group of :meth:`History.totals`: its name (a model, or a deployment) and what it summed."""

    name: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    credits: int
    errors: int


class History:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sqlite = db.dialect == "sqlite"

    async def _select(self, sql: str, args: Any = ()) -> list[tuple[Any, ...]]:
        return await self.db.select(sql, args)

    # -- the CLI's and the store's ----------------------------------------------------------------
    async def usage(
        self,
        group: str | None = None,
        key_id: int | None = None,
        source: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[UsageRecord]:
        """Usage records, newest first."""
        where: list[str] = []
        args: list[Any] = []
        for clause, value in (
            ("group_id = (SELECT id FROM groups WHERE name = ?)", group),
            ("key_id = ?", key_id),
            ("source = ?", source),
            ("id < ?", before_id),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = f"SELECT {USAGE_SELECT} FROM usage"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._select(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))
        return [usage_record(r) for r in rows]

    async def usage_by_model(
        self, key_id: int, since: float = 0.0, until: float | None = None
    ) -> list[ModelUsage]:
        rows = await self._select(
            "SELECT model, count(*), sum(prompt_tokens), sum(completion_tokens), sum(credits) FROM usage "
            "WHERE key_id = ? AND ts >= ? AND ts <= ? GROUP BY model",
            (key_id, since, until if until is not None else float("inf")),
        )
        return sorted(
            (ModelUsage(m, int(n), int(p), int(c), int(k)) for m, n, p, c, k in rows), key=lambda u: u.model
        )

    # -- periods as id ranges -----------------------------------------------------------------------
    async def first_id_at(self, t: float) -> int:
        """The smallest id from which on records are stamped at or after ``t`` (ids grow with time)."""
        rows = await self._select("SELECT (SELECT min(id) FROM usage), (SELECT max(id) FROM usage)")
        lo, top = rows[0]
        if lo is None:
            return 1
        hi = top + 1
        for _ in range(80):  # a binary search over 64-bit ids ends long before
            if lo >= hi:
                break
            mid = (lo + hi) // 2
            row = await self._select("SELECT ts FROM usage WHERE id >= ? ORDER BY id LIMIT 1", (mid,))
            if row[0][0] >= t:
                hi = mid
            else:
                lo = mid + 1
        return int(lo)

    async def id_range(self, since: float | None, until: float | None) -> tuple[int | None, int | None]:
        lo = await self.first_id_at(since - SKEW) if since is not None else None
        hi = await self.first_id_at(until + SKEW) if until is not None else None
        return lo, hi

    # -- history ------------------------------------------------------------------------------------
    def _where(self, f: Filter, lo: int | None, hi: int | None) -> tuple[str, list[Any]]:
        return where(f, lo, hi, self.sqlite)

    async def history(
        self, f: Filter, limit: int = 50, before: int | None = None, after: int | None = None
    ) -> Page:
        lo, hi = await self.id_range(f.since, f.until)
        base, args = self._where(f, lo, hi)
        if after is not None:
            sql = f"SELECT {USAGE_SELECT} {base} AND id > ? ORDER BY id ASC LIMIT ?"
            rows = list(reversed(await self._select(sql, (*args, after, limit + 1))))
            more_newer = len(rows) > limit
            rows = rows[-limit:] if more_newer else rows
            page = [usage_record(r) for r in rows]
            older = page[-1].id if page and await self._exists(base, args, "id < ?", page[-1].id) else None
            return Page(page, older, page[0].id if more_newer else None)
        sql = f"SELECT {USAGE_SELECT} {base}" + (" AND id < ?" if before is not None else "")
        sql += " ORDER BY id DESC LIMIT ?"
        rows = await self._select(sql, (*args, *([before] if before is not None else []), limit + 1))
        page = [usage_record(r) for r in rows[:limit]]
        older = page[-1].id if len(rows) > limit else None
        newer = None
        if before is not None and page and await self._exists(base, args, "id > ?", page[0].id):
            newer = page[0].id
        elif before is not None and not page and await self._exists(base, args, "id >= ?", before):
            newer = before - 1  # an empty page past the end: offer the way back
        return Page(page, older, newer)

    async def _exists(self, base: str, args: list[Any], clause: str, value: int) -> bool:
        return bool(await self._select(f"SELECT 1 {base} AND {clause} LIMIT 1", (*args, value)))

    async def export(self, f: Filter, max_rows: int, chunk: int = 1000) -> AsyncIterator[list[UsageRecord]]:
        """All rows of the filter (at most ``max_rows``), newest first, in chunks of ``chunk`` rows."""
        lo, hi = await self.id_range(f.since, f.until)
        base, args = self._where(f, lo, hi)
        before: int | None = None
        sent = 0
        for _ in range(max_rows // chunk + 2):  # bounded: each round moves the cursor down
            sql = f"SELECT {USAGE_SELECT} {base}" + (" AND id < ?" if before is not None else "")
            take = min(chunk, max_rows - sent)
            rows = await self._select(
                sql + " ORDER BY id DESC LIMIT ?", (*args, *([before] if before is not None else []), take)
            )
            if not rows:
                return
            yield [usage_record(r) for r in rows]
            sent += len(rows)
            if len(rows) < take or sent >= max_rows:
                return
            before = rows[-1][0]

    # -- aggregates -----------------------------------------------------------------------------------
    async def windows(self, lo: int | None, hi: int | None) -> list[tuple[int | None, int | None]]:
        """Id windows to aggregate over: one for PostgreSQL, ``CHUNK``-sized ones for SQLite."""
        if not self.sqlite:
            return [(lo, hi)]
        rows = await self._select("SELECT (SELECT min(id) FROM usage), (SELECT max(id) FROM usage)")
        first, last = rows[0]
        if first is None:
            return []
        start = max(first, lo or first)
        end = min(last + 1, hi if hi is not None else last + 1)
        return [(a, min(a + CHUNK, end)) for a in range(start, end, CHUNK)]

    async def buckets(self, f: Filter, start: float, width: float, count: int) -> list[Bucket]:
        """Calls and credits per bucket of ``width`` seconds from ``start`` (``count`` buckets)."""
        f = replace(f, since=start, until=start + width * count)
        lo, hi = await self.id_range(f.since, f.until)
        expr = "CAST((ts - ?) / ? AS INTEGER)" if self.sqlite else "floor((ts - ?) / ?)::int8"
        calls = [0] * count
        credits = [0] * count
        for a, b in await self.windows(lo, hi):
            base, args = self._where(f, a, b)
            sql = f"SELECT {expr} AS b, count(*), sum(credits) {base} GROUP BY 1"
            for n, c, s in await self._select(sql, (start, width, *args)):
                if 0 <= n < count:
                    calls[n] += int(c)
                    credits[n] += int(s or 0)
            await asyncio.sleep(0)
        return [Bucket(start + i * width, calls[i], credits[i]) for i in range(count)]

    async def first_ts(self, f: Filter) -> float | None:
        """When the oldest record of the filter was made."""
        base, args = self._where(f, *(await self.id_range(f.since, f.until)))
        rows = await self._select(f"SELECT ts {base} ORDER BY id LIMIT 1", args)
        return float(rows[0][0]) if rows else None

    async def count(self, f: Filter, cap: int) -> int:
        """How many records the filter has, counting no further than ``cap`` (then ``cap + 1``)."""
        base, args = self._where(f, *(await self.id_range(f.since, f.until)))
        rows = await self._select(
            f"SELECT count(*) FROM (SELECT 1 {base} LIMIT ?) AS matches", (*args, cap + 1)
        )
        return int(rows[0][0])

    async def record(self, usage_id: int) -> UsageRecord | None:
        rows = await self._select(f"SELECT {USAGE_SELECT} FROM usage WHERE id = ?", (usage_id,))
        return usage_record(rows[0]) if rows else None

    async def key_models(
        self, key_id: int, group_id: int, since: float | None, until: float | None
    ) -> list[Totals]:
        """One key's usage per model over a period."""
        return await self.totals(Filter(group_id, key_id=key_id, since=since, until=until), "model")

    async def totals(self, f: Filter, by: str) -> list[Totals]:
        """Calls, tokens, credits and failures per ``by`` (``model`` or ``deployment``) of a filter's rows."""
        if by not in ("model", "deployment"):
            raise ValueError(f"no totals by {by!r}")
        lo, hi = await self.id_range(f.since, f.until)
        totals: dict[str, list[int]] = {}
        for a, b in await self.windows(lo, hi):
            base, args = self._where(f, a, b)
            sql = (
                f"SELECT {by}, count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), "
                f"sum(reasoning_tokens), sum(credits), sum(CASE WHEN status = 'ok' THEN 0 ELSE 1 END) {base} "
                f"GROUP BY {by}"
            )
            for name, *numbers in await self._select(sql, args):
                row = totals.setdefault(name, [0] * 7)
                for i, value in enumerate(numbers):
                    row[i] += int(value or 0)
            await asyncio.sleep(0)
        return [Totals(name, *totals[name]) for name in sorted(totals)]
