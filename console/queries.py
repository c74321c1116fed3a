"""The read queries the console needs that the Store does not offer, for both stores.

- ``history``: a group's call history, newest first, filtered by period, model, key and source, one
  page at a time with keyset pagination on ``usage.id`` (``id < before`` / ``id > after``): a page
  costs the same at the millionth row as at the first.
- ``buckets``: calls and credits per time bucket, for the chart.
- ``key_models``: one key's usage per model over a period.

Speed with millions of rows comes from two things. (1) Indexes that end in ``id``, so every filter
is an index range read in id order: the store's ``usage(group_id, id)``, and three the console adds
to the ``usage`` table itself on first use (``(group_id, source, id)``, ``(group_id, model, id)``,
``(key_id, id)``; SQLite is told which to use, PostgreSQL's planner picks). (2) A period becomes an
id range: usage ids grow with their timestamps (a record is written when its call ends, stamped then),
so the first id at or after a time is found by binary search on the primary key (a few dozen point
reads). To stay exact despite small disorder (clocks of several replicas, commit batches), the id
range is widened by ``SKEW`` seconds on each side and the exact ``ts`` test applied inside it.

SQLite runs on the store's own thread (``store.run``); aggregates over large ranges are done in id
windows of ``CHUNK`` rows so settlements queued on that thread are not held up. PostgreSQL uses the
store's asyncpg pool. The console also keeps its settings (password hash, session secret) in a table
of its own, ``console_settings``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from billing.store import Store, StoreError, UsageRecord, usage_record

SKEW = 600.0  # seconds of timestamp disorder tolerated between ids
CHUNK = 50_000  # SQLite: ids per aggregate window
USAGE_COLS = (
    "id, ts, key_id, group_id, model, provider, endpoint, source, stream, prompt_tokens, completion_tokens, "
    "cached_tokens, cache_write_tokens, reasoning_tokens, credits, status, usage_exact, latency_ms, ttft_ms, "
    "upstream_request_id, request_id, error"
)
INDEXES = (
    ("console_usage_group_source", "usage(group_id, source, id)"),
    ("console_usage_group_model", "usage(group_id, model, id)"),
    ("console_usage_key", "usage(key_id, id)"),
)


@dataclass(frozen=True, slots=True)
class Filter:
    group_id: int
    source: str | None = None  # "api" | "job" | None (all)
    model: str | None = None
    key_id: int | None = None
    since: float | None = None
    until: float | None = None  # exclusive


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
class ModelRow:
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    credits: int
    errors: int


class Queries:
    """Dialect-neutral SQL (``?`` placeholders) over a backend's ``fetch``."""

    sqlite = False

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ready = False
        self._lock = asyncio.Lock()

    # -- backend primitives -------------------------------------------------------------------
    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    async def _setup(self) -> None:
        raise NotImplementedError

    async def ready(self) -> None:
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                await self._setup()
                self._ready = True

    # -- console settings ---------------------------------------------------------------------
    async def get_setting(self, name: str) -> str | None:
        await self.ready()
        rows = await self.fetch("SELECT value FROM console_settings WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    async def set_setting(self, name: str, value: str) -> None:
        await self.ready()
        await self.execute(
            "INSERT INTO console_settings (name, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (name, value, time.time()),
        )

    async def setting_or_default(self, name: str, default: str) -> str:
        """The stored value, storing ``default`` first if there is none (first writer wins)."""
        await self.ready()
        await self.execute(
            "INSERT INTO console_settings (name, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO NOTHING",
            (name, default, time.time()),
        )
        value = await self.get_setting(name)
        assert value is not None
        return value

    # -- periods as id ranges -----------------------------------------------------------------
    async def first_id_at(self, t: float) -> int:
        """The smallest id from which on records are stamped at or after ``t`` (ids grow with time)."""
        rows = await self.fetch("SELECT (SELECT min(id) FROM usage), (SELECT max(id) FROM usage)")
        lo, top = rows[0]
        if lo is None:
            return 1
        hi = top + 1
        for _ in range(80):  # a binary search over 64-bit ids ends long before
            if lo >= hi:
                break
            mid = (lo + hi) // 2
            row = await self.fetch("SELECT ts FROM usage WHERE id >= ? ORDER BY id LIMIT 1", (mid,))
            if row[0][0] >= t:
                hi = mid
            else:
                lo = mid + 1
        return int(lo)

    async def id_range(self, since: float | None, until: float | None) -> tuple[int | None, int | None]:
        lo = await self.first_id_at(since - SKEW) if since is not None else None
        hi = await self.first_id_at(until + SKEW) if until is not None else None
        return lo, hi

    # -- history --------------------------------------------------------------------------------
    def _where(self, f: Filter, lo: int | None, hi: int | None) -> tuple[str, list[Any]]:
        """The FROM and WHERE of a filter, on the index that serves it best (SQLite is told which)."""
        where: list[str]
        args: list[Any]
        if f.key_id is not None:
            index, where, args = "console_usage_key", ["key_id = ?", "group_id = ?"], [f.key_id, f.group_id]
        elif f.model is not None:
            index, where, args = (
                "console_usage_group_model",
                ["group_id = ?", "model = ?"],
                [f.group_id, f.model],
            )
        elif f.source is not None:
            index, where, args = (
                "console_usage_group_source",
                ["group_id = ?", "source = ?"],
                [f.group_id, f.source],
            )
        else:
            index, where, args = "usage_group_ts", ["group_id = ?"], [f.group_id]
        for clause, value in (
            ("model = ?", f.model),
            ("source = ?", f.source),
            ("ts >= ?", f.since),
            ("ts < ?", f.until),
            ("id >= ?", lo),
            ("id < ?", hi),
        ):
            if value is not None and clause not in where:
                where.append(clause)
                args.append(value)
        source = f"usage INDEXED BY {index}" if self.sqlite else "usage"
        return f"FROM {source} WHERE " + " AND ".join(where), args

    async def history(
        self, f: Filter, limit: int = 50, before: int | None = None, after: int | None = None
    ) -> Page:
        lo, hi = await self.id_range(f.since, f.until)
        base, args = self._where(f, lo, hi)
        if after is not None:
            sql = f"SELECT {USAGE_COLS} {base} AND id > ? ORDER BY id ASC LIMIT ?"
            rows = list(reversed(await self.fetch(sql, (*args, after, limit + 1))))
            more_newer = len(rows) > limit
            rows = rows[-limit:] if more_newer else rows
            page = [usage_record(r) for r in rows]
            older = page[-1].id if page and await self._exists(base, args, "id < ?", page[-1].id) else None
            return Page(page, older, page[0].id if more_newer else None)
        sql = f"SELECT {USAGE_COLS} {base}" + (" AND id < ?" if before is not None else "")
        sql += " ORDER BY id DESC LIMIT ?"
        rows = await self.fetch(sql, (*args, *([before] if before is not None else []), limit + 1))
        page = [usage_record(r) for r in rows[:limit]]
        older = page[-1].id if len(rows) > limit else None
        newer = None
        if before is not None and page and await self._exists(base, args, "id > ?", page[0].id):
            newer = page[0].id
        elif before is not None and not page and await self._exists(base, args, "id >= ?", before):
            newer = before - 1  # an empty page past the end: offer the way back
        return Page(page, older, newer)

    async def _exists(self, base: str, args: list[Any], clause: str, value: int) -> bool:
        return bool(await self.fetch(f"SELECT 1 {base} AND {clause} LIMIT 1", (*args, value)))

    async def export(self, f: Filter, max_rows: int, chunk: int = 1000) -> AsyncIterator[list[UsageRecord]]:
        """All rows of the filter (at most ``max_rows``), newest first, in chunks of ``chunk`` rows."""
        lo, hi = await self.id_range(f.since, f.until)
        base, args = self._where(f, lo, hi)
        before: int | None = None
        sent = 0
        for _ in range(max_rows // chunk + 2):  # bounded: each round moves the cursor down
            sql = f"SELECT {USAGE_COLS} {base}" + (" AND id < ?" if before is not None else "")
            take = min(chunk, max_rows - sent)
            rows = await self.fetch(
                sql + " ORDER BY id DESC LIMIT ?", (*args, *([before] if before is not None else []), take)
            )
            if not rows:
                return
            yield [usage_record(r) for r in rows]
            sent += len(rows)
            if len(rows) < take or sent >= max_rows:
                return
            before = rows[-1][0]

    # -- aggregates -----------------------------------------------------------------------------
    async def _windows(self, lo: int | None, hi: int | None) -> list[tuple[int | None, int | None]]:
        """Id windows to aggregate over: one for PostgreSQL, ``CHUNK``-sized ones for SQLite."""
        if not self.sqlite:
            return [(lo, hi)]
        rows = await self.fetch("SELECT (SELECT min(id) FROM usage), (SELECT max(id) FROM usage)")
        first, last = rows[0]
        if first is None:
            return []
        start = max(first, lo or first)
        end = min(last + 1, hi if hi is not None else last + 1)
        return [(a, min(a + CHUNK, end)) for a in range(start, end, CHUNK)]

    async def buckets(self, f: Filter, start: float, width: float, count: int) -> list[Bucket]:
        """Calls and credits per bucket of ``width`` seconds from ``start`` (``count`` buckets)."""
        f = Filter(f.group_id, f.source, f.model, f.key_id, start, start + width * count)
        lo, hi = await self.id_range(f.since, f.until)
        expr = "CAST((ts - ?) / ? AS INTEGER)" if self.sqlite else "floor((ts - ?) / ?)::int8"
        calls = [0] * count
        credits = [0] * count
        for a, b in await self._windows(lo, hi):
            base, args = self._where(f, a, b)
            sql = f"SELECT {expr} AS b, count(*), sum(credits) {base} GROUP BY 1"
            for n, c, s in await self.fetch(sql, (start, width, *args)):
                if 0 <= n < count:
                    calls[n] += int(c)
                    credits[n] += int(s or 0)
            await asyncio.sleep(0)
        return [Bucket(start + i * width, calls[i], credits[i]) for i in range(count)]

    async def first_ts(self, group_id: int) -> float | None:
        rows = await self.fetch("SELECT ts FROM usage WHERE group_id = ? ORDER BY id LIMIT 1", (group_id,))
        return float(rows[0][0]) if rows else None

    async def key_models(
        self,
        key_id: int,
        group_id: int,
        since: float | None,
        until: float | None,
    ) -> list[ModelRow]:
        f = Filter(group_id, key_id=key_id, since=since, until=until)
        lo, hi = await self.id_range(since, until)
        totals: dict[str, list[int]] = {}
        for a, b in await self._windows(lo, hi):
            base, args = self._where(f, a, b)
            sql = (
                "SELECT model, count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), "
                f"sum(reasoning_tokens), sum(credits), sum(CASE WHEN status = 'ok' THEN 0 ELSE 1 END) {base} "
                "GROUP BY model"
            )
            for model, *numbers in await self.fetch(sql, args):
                row = totals.setdefault(model, [0] * 7)
                for i, value in enumerate(numbers):
                    row[i] += int(value or 0)
            await asyncio.sleep(0)
        return [ModelRow(model, *totals[model]) for model in sorted(totals)]


class SQLiteQueries(Queries):
    sqlite = True

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self.store.run(lambda db: db.execute(sql, tuple(args)).fetchall())  # type: ignore[attr-defined, no-any-return]

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        await self.store.run(lambda db: db.execute(sql, tuple(args)))  # type: ignore[attr-defined]

    async def _setup(self) -> None:
        def fn(db: Any) -> None:
            db.execute(
                "CREATE TABLE IF NOT EXISTS console_settings "
                "(name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL)"
            )
            for name, target in INDEXES:
                db.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {target}")

        await self.store.run(fn)  # type: ignore[attr-defined]


def pg_sql(sql: str) -> str:
    """``?`` placeholders to ``$1, $2, ...`` (the console's SQL has no ``?`` anywhere else)."""
    parts = sql.split("?")
    return "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], start=1)) + parts[-1]


class PostgresQueries(Queries):
    def pool(self) -> Any:
        pool = getattr(self.store, "pool", None)
        if pool is None:
            raise StoreError("store is not open")
        return pool

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows = await self.pool().fetch(pg_sql(sql), *args)
        return [tuple(r) for r in rows]

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        await self.pool().execute(pg_sql(sql), *args)

    async def _setup(self) -> None:
        import asyncpg

        pool = self.pool()
        for _ in range(3):  # replicas starting together may race on IF NOT EXISTS
            try:
                await pool.execute(
                    "CREATE TABLE IF NOT EXISTS console_settings "
                    "(name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL)"
                )
                break
            except asyncpg.UniqueViolationError:
                await asyncio.sleep(0.05)
        for name, target in INDEXES:
            try:  # without blocking the gateway's writes; an index is only an optimisation
                await pool.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {target}")
            except asyncpg.PostgresError:
                pass


def queries_for(store: Store) -> Queries:
    from billing.postgres import PostgresStore
    from billing.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteQueries(store)
    if isinstance(store, PostgresStore):
        return PostgresQueries(store)
    raise TypeError(f"the console does not know how to query a {type(store).__name__}")
