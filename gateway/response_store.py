"""The stored responses of ``/v1/responses``, owned by their group, on the store's database handle.

Every response created with ``store`` true or absent is kept, for every provider group (docs/api.md,
"Responses API: stored responses"): its Response object (instructions, tools, usage, status, model,
``created_at``, ``previous_response_id`` and its output items: ``body``, as the API answers it) and its
input items (the request's own, item references resolved: ``input``, a JSON array), until
``expires_at``. ``response_items`` indexes every item id of a group to the response that holds it, so
an ``item_reference`` resolves in one query; a ``previous_response_id`` chain is one recursive query.

A background response is a row too (``request``: the call to run, until it ran; ``lease_owner`` and
``lease_expires``: the process running it, jobs/background.py). Its life: ``queued`` → ``in_progress``
(claimed, written before its call goes upstream) → ``completed`` | ``incomplete`` | ``failed`` |
``cancelled``. A row found ``in_progress`` with its lease run out was being run by a process that died:
it is failed, never run again (no call is billed twice).

Dialect-neutral SQL (``?`` placeholders) on :class:`billing.store.Database`: SQLite and PostgreSQL alike;
the tables and their own version table (``responses_schema_version``) are this module's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from billing.store import Database


def migrations(dialect: str) -> list[str]:
    """The scripts, per dialect only where it pays: on SQLite the item index is a table without rowid
    (one B-tree per item, not two: the stored call's cost)."""
    without_rowid = " WITHOUT ROWID" if dialect == "sqlite" else ""
    return [
        # 1: responses and the index of their items' ids (by group: item_reference; the purge and a
        # delete find a response's items from its own JSON)
        "CREATE TABLE responses (id TEXT PRIMARY KEY, group_id BIGINT NOT NULL, key_id BIGINT NOT NULL, "
        "status TEXT NOT NULL, model TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, "
        "expires_at DOUBLE PRECISION NOT NULL, previous_response_id TEXT, background INTEGER NOT NULL DEFAULT 0, "
        "body TEXT NOT NULL, input TEXT NOT NULL, error TEXT, request TEXT, "
        "lease_owner TEXT, lease_expires DOUBLE PRECISION);"
        "CREATE INDEX responses_expiry ON responses (expires_at);"
        "CREATE INDEX responses_queue ON responses (status, created_at) WHERE background = 1;"
        "CREATE TABLE response_items (group_id BIGINT NOT NULL, item_id TEXT NOT NULL, response_id TEXT NOT NULL, "
        f"PRIMARY KEY (group_id, item_id, response_id)){without_rowid}",
        # 2: the background queue by group: a claim visits the groups with queued responses (one index
        # probe each) and takes the oldest of the groups running the fewest
        "CREATE INDEX responses_queue_groups ON responses (status, group_id, created_at) WHERE background = 1",
        # 3: the gateway's own values shared by replicas (the key that seals reasoning state: gateway/sealed.py)
        "CREATE TABLE response_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]


MAX_GROUPS = 1000  # groups with queued background responses a claim looks at (by id)
# the groups with queued background responses, one index probe each (a loose index scan)
_QUEUED_GROUPS = (
    "WITH RECURSIVE g(id, n) AS ("
    "SELECT (SELECT min(group_id) FROM responses WHERE status = 'queued' AND background = 1), 1 "
    "UNION ALL SELECT (SELECT min(group_id) FROM responses WHERE status = 'queued' AND background = 1 "
    "AND group_id > g.id), n + 1 FROM g WHERE g.id IS NOT NULL AND n < ?) SELECT id FROM g"
)

OPEN = ("queued", "in_progress")  # a background response that may still change (and be cancelled)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

_COLUMNS = (
    "id, group_id, key_id, status, model, created_at, previous_response_id, background, body, input, error"
)


def _text(value: Any) -> str:
    return _encode(value).decode()


@dataclass(slots=True)
class Stored:
    """One stored response. ``body`` is the Response object (its ``output`` too)."""

    id: str
    group_id: int
    key_id: int
    status: str
    model: str
    created_at: float
    previous_response_id: str | None
    body: dict[str, Any]
    input: list[Any] = field(default_factory=list)
    output: list[Any] = field(default_factory=list)
    background: bool = False
    error: dict[str, Any] | None = None

    def response(self) -> dict[str, Any]:
        """The Response object as ``GET /v1/responses/{id}`` answers it."""
        out = dict(self.body)
        out["id"], out["status"] = self.id, self.status
        out.setdefault("output", [])
        if self.error is not None:
            out["error"] = self.error
        return out


def _row(row: tuple[Any, ...]) -> Stored:
    return Stored(
        id=row[0],
        group_id=int(row[1]),
        key_id=int(row[2]),
        status=row[3],
        model=row[4],
        created_at=float(row[5]),
        previous_response_id=row[6],
        background=bool(row[7]),
        body=(body := _decode(row[8])),
        input=_decode(row[9]),
        output=body.get("output") or [],
        error=_decode(row[10]) if row[10] else None,
    )


def item_ids(items: list[Any]) -> list[str]:
    return [item["id"] for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)]


class Encoded:
    """A response's JSON columns, encoded once (their size is what the limit counts)."""

    __slots__ = ("body", "input")

    def __init__(self, stored: Stored, body: bytes | None = None) -> None:
        """``body``: the Response object already encoded (the answer's bytes), if it is at hand."""
        self.body = body.decode() if body is not None else _text(stored.body)
        self.input = _text(stored.input)

    @property
    def size(self) -> int:
        return len(self.body) + len(self.input)


Steps = list[tuple[str, Sequence[Any]]]


class GroupWrite:
    """Writes that arrive while one is under way go together in the next transaction. A failed group is
    retried one writer at a time, so one bad write fails alone."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._waiting: list[tuple[Steps, asyncio.Future[None]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None  # (kept: the loop holds tasks weakly)

    async def write(self, steps: Steps) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((steps, future))
        if not self._running:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._flush())
        await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    await self.db.atomic([step for steps, _ in group for step in steps])
                except Exception as exc:
                    if len(group) == 1:
                        _settle(group[0][1], exc)
                        continue
                    for steps, future in group:
                        try:
                            await self.db.atomic(steps)
                            _settle(future)
                        except Exception as one:
                            _settle(future, one)
                    continue
                for _, future in group:
                    _settle(future)
        finally:
            self._running = False


def _settle(future: asyncio.Future[None], exc: BaseException | None = None) -> None:
    if not future.done():
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False
        self._lock = asyncio.Lock()
        self._commit = GroupWrite(db)

    async def ready(self) -> None:
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                await self.db.migrate("responses_schema_version", migrations(self.db.dialect))
                self._ready = True

    async def setting(self, name: str, default: str) -> str:
        """The stored value of ``name``, storing ``default`` first if there is none (the first writer wins:
        every replica reads the same)."""
        await self.ready()
        await self.db.write(
            "INSERT INTO response_settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, default),
        )
        rows = await self.db.select("SELECT value FROM response_settings WHERE name = ?", (name,))
        return str(rows[0][0])

    # -- writes ------------------------------------------------------------------------------------
    def _items(self, stored: Stored) -> list[tuple[str, list[Any]]]:
        ids = list(dict.fromkeys(item_ids(stored.input) + item_ids(stored.output)))
        if not ids:
            return []
        values = ", ".join(["(?, ?, ?)"] * len(ids))
        args = [value for item in ids for value in (stored.id, item, stored.group_id)]
        return [
            (
                f"INSERT INTO response_items (response_id, item_id, group_id) VALUES {values} "
                "ON CONFLICT DO NOTHING",
                args,
            )
        ]

    async def insert(
        self, stored: Stored, encoded: Encoded, expires_at: float, request: bytes | None = None
    ) -> None:
        """A new response (``request``: a background one's call, still to run), written with the others
        that arrive while a write is under way: one transaction (one fsync on SQLite) for all of them."""
        await self.ready()
        await self._commit.write(
            [
                (
                    "INSERT INTO responses (id, group_id, key_id, status, model, created_at, expires_at, "
                    "previous_response_id, background, body, input, request) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        stored.id,
                        stored.group_id,
                        stored.key_id,
                        stored.status,
                        stored.model,
                        stored.created_at,
                        expires_at,
                        stored.previous_response_id,
                        int(stored.background),
                        encoded.body,
                        encoded.input,
                        request.decode() if request is not None else None,
                    ),
                ),
                *self._items(stored),
            ]
        )

    async def finish(self, stored: Stored, encoded: Encoded) -> bool:
        """A background response's outcome, unless it was cancelled (or failed) meanwhile."""
        await self.ready()
        # (its input items were kept when it was queued; its output's ids are indexed only if it was updated)
        counts = await self.db.atomic(
            [
                (
                    "UPDATE responses SET status = ?, model = ?, body = ?, request = NULL, "
                    "lease_owner = NULL WHERE id = ? AND group_id = ? AND status = 'in_progress'",
                    (stored.status, stored.model, encoded.body, stored.id, stored.group_id),
                ),
                *[
                    (
                        "INSERT INTO response_items (response_id, item_id, group_id) SELECT ?, ?, ? WHERE EXISTS "
                        "(SELECT 1 FROM responses WHERE id = ? AND status = ?) ON CONFLICT DO NOTHING",
                        (stored.id, item, stored.group_id, stored.id, stored.status),
                    )
                    for item in dict.fromkeys(item_ids(stored.output))
                ],
            ]
        )
        return counts[0] == 1

    async def has(self, stored: Stored) -> bool:
        """Whether ``stored`` is there as written (by ``insert`` or ``finish``): a write whose outcome is
        unknown, read back."""
        rows = await self.db.select(
            "SELECT 1 FROM responses WHERE id = ? AND group_id = ? AND status = ?",
            (stored.id, stored.group_id, stored.status),
        )
        return bool(rows)

    async def fail(self, response_id: str, error: dict[str, Any], statuses: tuple[str, ...] = OPEN) -> bool:
        await self.ready()
        marks = ", ".join("?" * len(statuses))
        counts = await self.db.atomic(
            [
                (
                    f"UPDATE responses SET status = 'failed', error = ?, request = NULL, lease_owner = NULL "
                    f"WHERE id = ? AND status IN ({marks})",
                    (_text(error), response_id, *statuses),
                ),
            ]
        )
        return counts[0] == 1

    async def cancel(self, group_id: int, response_id: str) -> bool:
        """A queued or running background response → ``cancelled`` (False: it had ended)."""
        await self.ready()
        counts = await self.db.atomic(
            [
                (
                    "UPDATE responses SET status = 'cancelled', request = NULL "
                    "WHERE id = ? AND group_id = ? AND background = 1 AND status IN ('queued', 'in_progress')",
                    (response_id, group_id),
                ),
            ]
        )
        return counts[0] == 1

    async def delete(self, group_id: int, response_id: str, now: float | None = None) -> bool:
        found = await self.get(group_id, response_id, now)
        if found is None:
            return False
        counts = await self.db.atomic(
            [
                ("DELETE FROM responses WHERE id = ? AND group_id = ?", (response_id, group_id)),
                *self._unindex([found]),
            ]
        )
        return counts[0] == 1

    @staticmethod
    def _unindex(gone: list[Stored]) -> Steps:
        return [
            (
                "DELETE FROM response_items WHERE group_id = ? AND item_id = ? AND response_id = ?",
                (stored.group_id, item, stored.id),
            )
            for stored in gone
            for item in dict.fromkeys(item_ids(stored.input) + item_ids(stored.output))
        ]

    async def purge(self, now: float | None = None, batch: int = 500) -> int:
        """Delete the responses whose retention ran out (``batch`` at a time); how many."""
        await self.ready()
        now = now or time.time()
        purged = 0
        while True:
            rows = await self.db.select(
                f"SELECT {_COLUMNS} FROM responses WHERE expires_at <= ? LIMIT ?", (now, batch)
            )
            if not rows:
                return purged
            gone = [_row(row) for row in rows]
            marks = ", ".join("?" * len(gone))
            counts = await self.db.atomic(
                [
                    (f"DELETE FROM responses WHERE id IN ({marks})", tuple(stored.id for stored in gone)),
                    *self._unindex(gone),
                ]
            )
            purged += counts[0]

    # -- reads -------------------------------------------------------------------------------------
    async def get(self, group_id: int, response_id: str, now: float | None = None) -> Stored | None:
        await self.ready()
        rows = await self.db.select(
            f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND group_id = ? AND expires_at > ?",
            (response_id, group_id, now or time.time()),
        )
        return _row(rows[0]) if rows else None

    async def chain(
        self, group_id: int, response_id: str, limit: int, now: float | None = None
    ) -> list[Stored]:
        """The response ``response_id`` and its ancestors, oldest first, at most ``limit + 1`` of them
        (the caller refuses a longer chain); the first one's ``previous_response_id`` is set when a
        link is missing (deleted, expired) or the chain was cut at the limit."""
        await self.ready()
        now = now or time.time()
        rows = await self.db.select(
            "WITH RECURSIVE chain (id, previous_response_id, depth) AS ("
            "SELECT id, previous_response_id, 0 FROM responses WHERE id = ? AND group_id = ? AND expires_at > ? "
            "UNION ALL SELECT r.id, r.previous_response_id, c.depth + 1 FROM responses r "
            "JOIN chain c ON r.id = c.previous_response_id WHERE r.group_id = ? AND r.expires_at > ? AND c.depth < ?) "
            f"SELECT {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))} FROM chain c "
            "JOIN responses r ON r.id = c.id ORDER BY c.depth DESC",
            (response_id, group_id, now, group_id, now, limit),
        )
        return [_row(row) for row in rows]

    async def items(
        self, group_id: int, ids: list[str], now: float | None = None
    ) -> dict[str, dict[str, Any]]:
        """The stored items of the group with these ids (input or output of a live response)."""
        await self.ready()
        wanted = set(ids)
        marks = ", ".join("?" * len(wanted))
        rows = await self.db.select(
            f"SELECT r.input, r.body FROM response_items i JOIN responses r ON r.id = i.response_id "
            f"WHERE i.group_id = ? AND i.item_id IN ({marks}) AND r.expires_at > ? ORDER BY r.created_at",
            (group_id, *wanted, now or time.time()),
        )
        found: dict[str, dict[str, Any]] = {}
        for raw_input, raw_body in rows:
            for item in [*_decode(raw_input), *(_decode(raw_body).get("output") or [])]:
                if isinstance(item, dict) and item.get("id") in wanted:
                    found[item["id"]] = item
        return found

    # -- background --------------------------------------------------------------------------------
    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[tuple[str, int, bytes]]:
        """Up to ``limit`` queued background responses, now ``in_progress`` under ``owner``'s lease:
        (id, key id, request). Groups share the runners: each place goes to the group with the fewest
        running now (by any replica, the ones taken here included), its oldest queued response; one
        group's thousand queued responses do not keep another's waiting behind them."""
        await self.ready()
        chosen = await self._fair(limit)
        if not chosen:
            return []
        now = time.time()
        marks = ", ".join("?" * len(chosen))
        await self.db.write(
            "UPDATE responses SET status = 'in_progress', lease_owner = ?, lease_expires = ? "
            f"WHERE status = 'queued' AND background = 1 AND id IN ({marks})",
            (owner, now + lease_seconds, *chosen),
        )
        rows = await self.db.select(
            "SELECT id, key_id, request FROM responses WHERE status = 'in_progress' AND background = 1 "
            "AND lease_owner = ?",
            (owner,),
        )
        return [(row[0], int(row[1]), str(row[2] or "").encode()) for row in rows]

    async def _fair(self, limit: int) -> list[str]:
        """The ids of the ``limit`` queued responses to run next (a claim by another replica meanwhile
        just takes some of them first)."""
        groups = [
            int(row[0]) for row in await self.db.select(_QUEUED_GROUPS, (MAX_GROUPS,)) if row[0] is not None
        ]
        if not groups:
            return []
        running = dict(
            await self.db.select(
                "SELECT group_id, count(*) FROM responses WHERE status = 'in_progress' AND background = 1 GROUP BY group_id"
            )
        )
        load = {group: int(running.get(group, 0)) for group in groups}
        picks: dict[int, int] = {}  # group -> responses taken from it
        for _ in range(limit):
            group = min(load, key=lambda g: (load[g], g))
            load[group] += 1
            picks[group] = picks.get(group, 0) + 1
        chosen: list[str] = []
        for group, count in picks.items():
            rows = await self.db.select(
                "SELECT id FROM responses WHERE status = 'queued' AND background = 1 AND group_id = ? "
                "ORDER BY created_at LIMIT ?",
                (group, count),
            )
            chosen += [row[0] for row in rows]
        return chosen

    async def renew(self, owners: list[str], lease_seconds: float) -> list[str]:
        """Extend the leases of ``owners``; the ids among theirs that were cancelled meanwhile."""
        await self.ready()
        if not owners:
            return []
        marks = ", ".join("?" * len(owners))
        await self.db.write(
            f"UPDATE responses SET lease_expires = ? WHERE status = 'in_progress' AND background = 1 "
            f"AND lease_owner IN ({marks})",
            (time.time() + lease_seconds, *owners),
        )
        rows = await self.db.select(
            f"SELECT id FROM responses WHERE status = 'cancelled' AND background = 1 AND lease_owner IN ({marks})",
            tuple(owners),
        )
        return [row[0] for row in rows]

    async def orphans(self, every: bool = False) -> list[str]:
        """Background responses left ``in_progress`` by a process that is gone (their lease ran out;
        ``every``: all of them, when no other process may run any)."""
        await self.ready()
        sql = "SELECT id FROM responses WHERE status = 'in_progress' AND background = 1"
        rows = await self.db.select(
            sql if every else sql + " AND lease_expires < ?", () if every else (time.time(),)
        )
        return [row[0] for row in rows]
