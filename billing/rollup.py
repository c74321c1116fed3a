"""Rollups of the usage records: what aggregates over long periods read instead of millions of rows.

Four tables, each the counts (calls, failed, rejected, credits, tokens) of the records per period and
per combination of some of their fields (a :class:`Level`):

    usage_daily        per UTC day,  group, key, model, provider, deployment, endpoint, source
    usage_hourly       per UTC hour, group, key, model, provider, deployment, endpoint, source
    usage_daily_groups   per UTC day,  group, source
    usage_hourly_groups  per UTC hour, group, source

They are built from the ``usage`` table up to a watermark, ``usage_rollup.rolled``: every record with
an id at or below it is counted in each of them, none above it. :meth:`Rollup.refresh` moves the
watermark forward over the records stamped more than ``LAG`` seconds ago (ids grow with time, but a
record may be committed a little after a higher id: its call's settlement was queued first), in
transactions of at most ``CHUNK`` ids, each of which adds its records' counts to the four tables and
moves the watermark. Two processes refreshing at once cannot count a record twice: each transaction
moves the watermark only from where it read it and marks the move with a token of its own, and its
inserts count rows only under that token (on PostgreSQL the second one waits for the first's row
lock, then finds the watermark moved and inserts nothing).

Nothing on a call's path touches the rollups: they are caught up when aggregates are read (at most
every ``EVERY`` seconds; a reader rolls up at most ``max_ids`` records itself and leaves the rest to a
task of the process, so the first page after a long quiet time does not wait for all of them) and by
:meth:`Rollup.refresh` (the bench, after loading a million rows).
Readers add the records above the watermark from the ``usage`` table itself (billing/analysis.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from billing.history import History

HOUR, DAY = 3600, 86400
LAG = 600.0  # seconds: records stamped more recently than this are left above the watermark
CHUNK = 20_000  # ids per refresh transaction (SQLite: the store's thread is held that long)
EVERY = 15.0  # seconds between refreshes started by readers
WIDE = ("group_id", "key_id", "model", "provider", "deployment", "endpoint", "source")
COUNTS = (
    "calls",
    "errors",
    "rejected",
    "credits",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
)
# the counts of a set of usage records, in COUNTS order
RAW_COUNTS = (
    "count(*), sum(CASE WHEN status IN ('error', 'interrupted') THEN 1 ELSE 0 END), "
    "sum(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), sum(credits), sum(prompt_tokens), "
    "sum(completion_tokens), sum(cached_tokens), sum(reasoning_tokens)"
)
ROLLED_COUNTS = ", ".join(f"sum({c})" for c in COUNTS)
# each batch's counts over its records up to ``upto`` (a watermark of the rollups when it was kept):
# the batches' pages read one row per batch, however many lines it had (billing/analysis.py)
BATCH_TOTALS = (
    f"CREATE TABLE usage_batch_totals (batch_id TEXT PRIMARY KEY, upto BIGINT NOT NULL, "
    f"{', '.join(f'{c} BIGINT NOT NULL' for c in COUNTS)})"
)


@dataclass(frozen=True, slots=True)
class Level:
    table: str
    width: int  # seconds per period: HOUR or DAY (UTC)
    dims: tuple[str, ...]
    indexes: tuple[tuple[str, ...], ...] = ()  # besides the key (period first)

    def answers(self, fields: set[str], by: tuple[str, ...]) -> bool:
        """Whether totals of a filter on ``fields``, grouped by ``by``, can be read from this level."""
        dims = set(self.dims) | {"since", "until"}
        if "models" in fields:
            fields = (fields - {"models"}) | {"model"}
        return fields <= dims and all(b in self.dims or (b == "hour" and self.width == HOUR) for b in by)

    def script(self, sqlite: bool) -> str:
        big = "INTEGER" if sqlite else "BIGINT"
        types = {"group_id": big, "key_id": big}
        columns = ", ".join(f"{d} {types.get(d, 'TEXT')} NOT NULL" for d in self.dims)
        counts = ", ".join(f"{c} {big} NOT NULL" for c in COUNTS)
        out = [
            f"CREATE TABLE {self.table} (period {big} NOT NULL, {columns}, {counts}, "
            f"PRIMARY KEY (period, {', '.join(self.dims)}))"
        ]
        for n, index in enumerate(self.indexes):
            out.append(f"CREATE INDEX {self.table}_{n} ON {self.table}({', '.join(index)}, period)")
        return ";\n".join(out)

    def roll(self, sqlite: bool) -> str:
        """SQL: add the counts of the records with ids in (?, ?] to this level, under a token (?)."""
        dims = ", ".join(self.dims)
        period = (
            f"(CAST(ts / {self.width} AS INTEGER) * {self.width})"
            if sqlite
            else (f"(floor(ts / {self.width}) * {self.width})::int8")
        )
        updates = ", ".join(f"{c} = {self.table}.{c} + excluded.{c}" for c in COUNTS)
        return (
            f"INSERT INTO {self.table} (period, {dims}, {', '.join(COUNTS)}) "
            f"SELECT {period}, {dims}, {RAW_COUNTS} FROM usage "
            "WHERE id > ? AND id <= ? AND (SELECT token FROM usage_rollup WHERE id = 1) = ? "
            f"GROUP BY 1, {dims} ON CONFLICT (period, {dims}) DO UPDATE SET {updates}"
        )


# coarsest first, and the narrow one of a width before the wide one: the order readers try them in
LEVELS = (
    Level("usage_daily_groups", DAY, ("group_id", "source")),
    Level("usage_daily", DAY, WIDE, (("group_id",), ("key_id",))),
    Level("usage_hourly_groups", HOUR, ("group_id", "source")),
    Level("usage_hourly", HOUR, WIDE, (("group_id",), ("key_id",))),
)


def hour_of(sqlite: bool) -> str:
    """SQL: the start of a record's UTC hour, from its ``ts``."""
    return "(CAST(ts / 3600 AS INTEGER) * 3600)" if sqlite else "(floor(ts / 3600) * 3600)::int8"


def rebuild(sqlite: bool) -> str:
    """A migration that drops the rollups and makes them anew, empty, with the watermark at 0: they
    are derived from the usage table, so a change of their shape costs one refresh from the start."""
    drops = [f"DROP TABLE IF EXISTS {level.table}" for level in LEVELS] + [
        "DROP TABLE IF EXISTS usage_rollup"
    ]
    return ";\n".join([*drops, migration(sqlite)])


def migration(sqlite: bool) -> str:
    """The script that creates the rollups' tables (billing's migrations, both stores)."""
    big = "INTEGER" if sqlite else "BIGINT"
    return ";\n".join(
        [
            *(level.script(sqlite) for level in LEVELS),
            f"CREATE TABLE usage_rollup (id INTEGER PRIMARY KEY, rolled {big} NOT NULL, token TEXT NOT NULL)",
            "INSERT INTO usage_rollup (id, rolled, token) VALUES (1, 0, '')",
        ]
    )


class Rollup:
    def __init__(self, history: History) -> None:
        self.history = history
        self.db = history.db
        self.sqlite = history.sqlite
        self._lock = asyncio.Lock()
        self._refreshed = 0.0
        self._behind = False  # the last refresh stopped at max_ids, short of its target
        self._task: asyncio.Task[int] | None = None
        self._rolls = [level.roll(self.sqlite) for level in LEVELS]

    async def rolled(self) -> int:
        """The watermark: every record with an id at or below it is in the rollups."""
        rows = await self.db.select("SELECT rolled FROM usage_rollup WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    async def refresh(self, now: float | None = None, max_ids: int | None = None) -> int:
        """Roll up the records stamped before ``now - LAG`` (at most ``max_ids`` of them); the
        watermark after."""
        async with self._lock:
            now = time.time() if now is None else now
            self._refreshed = time.monotonic()
            target = await self.history.first_id_at(now - LAG) - 1
            rolled = await self.rolled()
            self._behind = max_ids is not None and target > rolled + max_ids
            if max_ids is not None:
                target = min(target, rolled + max_ids)
            while rolled < target:
                upto = min(rolled + CHUNK, target)
                token = secrets.token_hex(8)
                steps: list[tuple[str, Sequence[Any]]] = [
                    (
                        "UPDATE usage_rollup SET rolled = ?, token = ? WHERE id = 1 AND rolled = ?",
                        (upto, token, rolled),
                    ),
                    *((roll, (rolled, upto, token)) for roll in self._rolls),
                ]
                await self.db.atomic(steps)
                rolled = await self.rolled()  # (another process may have moved it further)
                await asyncio.sleep(0)
            return rolled

    async def fresh(self, max_ids: int = 200_000) -> int:
        """The watermark, refreshed first if the last refresh is more than ``EVERY`` seconds old (a
        reader's: at most ``max_ids`` records rolled up now; the rest are read from ``usage``)."""
        if time.monotonic() - self._refreshed > EVERY:
            rolled = await self.refresh(max_ids=max_ids)
            if self._behind and (self._task is None or self._task.done()):
                self._task = asyncio.get_running_loop().create_task(self.refresh(), name="usage-rollup")
                self._task.add_done_callback(_quiet)
            return rolled
        return await self.rolled()


def _quiet(task: asyncio.Task[int]) -> None:
    """A background refresh that failed (the store went away, or closed at shutdown) is simply tried
    again by the next reader."""
    if not task.cancelled():
        task.exception()
