"""The jobs store: files, batches and their lines, behind one small async interface.

Implementations: :mod:`jobs.sqlite` (file contents on disk) and :mod:`jobs.postgres` (file contents as
``bytea``). Both run on the billing store's database handle (``store.database``: one connection and
thread, or one pool, per process), migrate tables of their own on it and only read the billing
``keys`` and ``groups`` tables (:meth:`JobStore.principal_by_id`).

A line's life: ``pending`` → ``running`` (claimed, written durably *before* its call goes upstream) →
``done`` | ``failed``. A line found ``running`` by a new lease holder was in flight when its runner
died: it is failed, never run again (at most once).
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from billing.schema import ddl
from billing.store import Database, Principal, principal_query, principal_row

OPEN = ("validating", "in_progress", "finalizing", "cancelling")  # a runner still has work to do

# the batch columns, in the order of BatchRow's fields (both stores select them in this order)
BATCH_COLUMNS = (
    "id",
    "group_id",
    "key_id",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "expires_at",
    "metadata",
    "errors",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "output_file_id",
    "error_file_id",
    "total",
    "completed",
    "failed",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "lease_owner",
)
FILE_COLUMNS = ("id", "group_id", "key_id", "purpose", "filename", "bytes", "created_at", "expires_at")
# the column of each final status's time (Batch.finalize)
ENDED_AT = {
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelled": "cancelled_at",
}


def migrations(dialect: str) -> list[str]:
    """The jobs tables, in either dialect (billing/schema.py): the same columns, but PostgreSQL keeps
    a file's content in its row (``data``), SQLite in the files directory."""
    data = ",\n        data {bytes} NOT NULL" if dialect != "sqlite" else ""
    return ddl(
        dialect,
        # 1: files, batches, batch lines
        """
    CREATE TABLE files (
        seq {id},
        id TEXT NOT NULL UNIQUE,
        group_id {int} NOT NULL,
        key_id {int} NOT NULL,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes {int} NOT NULL,
        created_at {int} NOT NULL,
        expires_at {int}"""
        + data
        + """
    );
    CREATE INDEX files_group ON files(group_id, seq);
    CREATE TABLE batches (
        seq {id},
        id TEXT NOT NULL UNIQUE,
        group_id {int} NOT NULL,
        key_id {int} NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at {int} NOT NULL,
        expires_at {int} NOT NULL,
        metadata TEXT,
        errors TEXT,
        in_progress_at {int},
        finalizing_at {int},
        completed_at {int},
        failed_at {int},
        expired_at {int},
        cancelling_at {int},
        cancelled_at {int},
        output_file_id TEXT,
        error_file_id TEXT,
        total {int} NOT NULL DEFAULT 0,
        completed {int} NOT NULL DEFAULT 0,
        failed {int} NOT NULL DEFAULT 0,
        input_tokens {int} NOT NULL DEFAULT 0,
        output_tokens {int} NOT NULL DEFAULT 0,
        cached_tokens {int} NOT NULL DEFAULT 0,
        reasoning_tokens {int} NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_until {real}
    );
    CREATE INDEX batches_group ON batches(group_id, seq);
    CREATE INDEX batches_open ON batches(status, seq);
    CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL,
        line_no INTEGER NOT NULL,
        custom_id TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        owner TEXT,
        started_at {real},
        finished_at {real},
        result TEXT,
        PRIMARY KEY (batch_id, line_no)
    );
    CREATE INDEX batch_lines_state ON batch_lines(batch_id, state, line_no);
    """,
    )


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """One group's open batches: held by a runner now, and free to be claimed."""

    running: int
    waiting: int


class JobStoreError(Exception):
    """A jobs store operation could not be done."""


@dataclass(slots=True)
class FileRow:
    id: str
    group_id: int
    key_id: int
    purpose: str  # batch | batch_output
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None = None

    def values(self) -> tuple[Any, ...]:
        """The row's values in FILE_COLUMNS order."""
        return tuple(getattr(self, name) for name in FILE_COLUMNS)


@dataclass(slots=True)
class BatchRow:
    id: str
    group_id: int
    key_id: int
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    lease_owner: str | None = None

    def values(self) -> tuple[Any, ...]:
        """The row's values in BATCH_COLUMNS order, JSON fields encoded."""
        out = [getattr(self, name) for name in BATCH_COLUMNS]
        out[9] = json.dumps(self.metadata) if self.metadata is not None else None
        out[10] = json.dumps(self.errors) if self.errors is not None else None
        return tuple(out)


def batch_of(row: Any) -> BatchRow:
    values = list(row)
    values[9] = json.loads(values[9]) if values[9] else None
    values[10] = json.loads(values[10]) if values[10] else None
    return BatchRow(*values)


def file_of(row: Any) -> FileRow:
    return FileRow(*row)


@dataclass(frozen=True, slots=True)
class Line:
    """One request of a batch, as the runner needs it."""

    line_no: int  # 1-based line number in the input file
    custom_id: str
    body: str  # the request body, JSON


@dataclass(frozen=True, slots=True)
class LineState:
    line_no: int
    custom_id: str
    state: str  # pending | running | done | failed
    result: str | None  # the output or error file line (JSON, no newline)


@dataclass(slots=True)
class Tokens:
    input: int = 0
    output: int = 0
    cached: int = 0
    reasoning: int = 0


@dataclass(slots=True)
class Outcome:
    """A finished line: its line in the output file (ok) or in the error file."""

    ok: bool
    result: str
    tokens: Tokens = field(default_factory=Tokens)


@dataclass(slots=True)
class Final:
    """How a batch ends: its status, the time of it, and the two files (either may be absent)."""

    status: str  # completed | failed | expired | cancelled
    at: int
    completed: int
    failed: int
    output: FileRow | None = None
    output_data: bytes = b""
    error: FileRow | None = None
    error_data: bytes = b""

    @property
    def files(self) -> list[tuple[FileRow, bytes]]:
        """The files it creates, with their contents."""
        return [
            (file, data)
            for file, data in ((self.output, self.output_data), (self.error, self.error_data))
            if file is not None
        ]


class JobStore(ABC):
    """The operations both stores run alike are written here once, in dialect-neutral SQL on the
    billing store's database handle (``db``); each store keeps what differs: claims, clocks, files."""

    @property
    @abstractmethod
    def db(self) -> Database: ...

    @abstractmethod
    async def open(self) -> None:
        """Migrate the jobs tables (on the billing store's database handle, opened by that store)."""

    # -- callers ------------------------------------------------------------------------------------
    async def principal_by_id(self, key_id: int) -> Principal | None:
        """The key with this id and its group, unless revoked (read from the billing tables)."""
        rows = await self.db.select(_PRINCIPAL_BY_ID, (key_id,))
        return principal_row(rows[0] if rows else None)

    # -- files --------------------------------------------------------------------------------------
    def file_insert(self, row: FileRow, data: bytes) -> tuple[str, tuple[Any, ...]]:
        """The statement that inserts a file's row (PostgreSQL's with its content)."""
        return f"INSERT INTO files ({', '.join(FILE_COLUMNS)}) VALUES ({_marks(FILE_COLUMNS)})", row.values()

    async def create_file(self, row: FileRow, data: bytes) -> None:
        await self.db.write(*self.file_insert(row, data))

    async def get_file(self, group_id: int, file_id: str) -> FileRow | None:
        rows = await self.db.select(f"{_FILE} WHERE id = ? AND group_id = ?", (file_id, group_id))
        return file_of(rows[0]) if rows else None

    @abstractmethod
    async def file_content(self, group_id: int, file_id: str) -> bytes | None: ...

    async def list_files(
        self, group_id: int, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> list[FileRow]:
        """Up to ``limit`` files of the group, newest first (or oldest first), after the file ``after``."""
        cmp, order = (">", "ASC") if ascending else ("<", "DESC")
        where, args = _where(
            ("group_id = ?", group_id),
            ("purpose = ?", purpose),
            (f"seq {cmp} (SELECT seq FROM files WHERE id = ? AND group_id = ?)", after, group_id),
        )
        rows = await self.db.select(f"{_FILE} WHERE {where} ORDER BY seq {order} LIMIT ?", (*args, limit))
        return [file_of(r) for r in rows]

    async def delete_file(self, group_id: int, file_id: str) -> bool:
        changed = await self.db.atomic(
            [("DELETE FROM files WHERE id = ? AND group_id = ?", (file_id, group_id))]
        )
        return changed[0] > 0

    # -- batches ------------------------------------------------------------------------------------
    async def create_batch(self, row: BatchRow) -> None:
        await self.db.write(
            f"INSERT INTO batches ({', '.join(BATCH_COLUMNS)}) VALUES ({_marks(BATCH_COLUMNS)})", row.values()
        )

    async def get_batch(self, group_id: int | None, batch_id: str) -> BatchRow | None:
        """The batch, if it belongs to the group (``None``: any group, for the runner)."""
        where, args = _where(("id = ?", batch_id), ("group_id = ?", group_id))
        rows = await self.db.select(f"{_BATCH} WHERE {where}", args)
        return batch_of(rows[0]) if rows else None

    async def list_batches(self, group_id: int, after: str | None, limit: int) -> list[BatchRow]:
        """Up to ``limit`` batches of the group, newest first, after the batch ``after``."""
        where, args = _where(
            ("group_id = ?", group_id),
            ("seq < (SELECT seq FROM batches WHERE id = ? AND group_id = ?)", after, group_id),
        )
        rows = await self.db.select(f"{_BATCH} WHERE {where} ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [batch_of(r) for r in rows]

    async def browse(
        self, group_id: int | None, status: str | None, before: str | None, limit: int
    ) -> list[BatchRow]:
        """Up to ``limit`` batches, newest first, older than the batch ``before``: of one group or of
        all (``None``), of one status or of any (the console's list)."""
        where, args = _where(
            ("group_id = ?", group_id),
            ("status = ?", status),
            ("seq < (SELECT seq FROM batches WHERE id = ?)", before),
        )
        rows = await self.db.select(f"{_BATCH} WHERE {where} ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [batch_of(r) for r in rows]

    async def cancel_batch(self, group_id: int, batch_id: str, now: int) -> BatchRow | None:
        """``validating``/``in_progress`` → ``cancelling``; returns the batch as it now is."""
        await self.db.write(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ? AND group_id = ? "
            "AND status IN ('validating', 'in_progress')",
            (now, batch_id, group_id),
        )
        return await self.get_batch(group_id, batch_id)

    # -- leases (one runner per batch at a time) ----------------------------------------------------
    @abstractmethod
    async def claim_batch(self, owner: str, lease: float, skip: list[str]) -> BatchRow | None:
        """Take an open batch whose lease is free or expired (not one in ``skip``) for ``lease`` s: of
        the groups with such a batch, one with the fewest batches running now (held by any runner),
        and of those the oldest batch. A group's many batches do not keep the others' waiting."""

    @abstractmethod
    async def batch_load(self, skip: list[str]) -> dict[int, GroupLoad]:
        """Per group with an open batch: how many run now (their lease held) and how many wait (free
        or expired, not in ``skip``)."""

    @abstractmethod
    async def renew(self, batch_id: str, owner: str, lease: float) -> str | None:
        """Extend our lease; the batch's status, or None if the lease is no longer ours."""

    async def release(self, batch_id: str, owner: str) -> None:
        await self.db.write(
            f"UPDATE batches SET lease_owner = NULL, lease_until = NULL WHERE {HELD}", (batch_id, owner)
        )

    async def release_all(self) -> int:
        """Free every lease (SQLite: one gateway per file, so any lease is from a process now gone)."""
        changed = await self.db.atomic(
            [("UPDATE batches SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL", ())]
        )
        return changed[0]

    # -- the run of one batch (every write is conditional on holding its lease) ----------------------
    @abstractmethod
    async def start_batch(self, batch_id: str, owner: str, lines: list[Line], now: int) -> bool:
        """Validated: store the lines; ``validating`` → ``in_progress`` (a ``cancelling`` batch stays so)."""

    async def fail_batch(self, batch_id: str, owner: str, errors: list[dict[str, Any]], now: int) -> bool:
        """Validation failed: ``failed`` with ``errors``; the lease is let go."""
        changed = await self.db.atomic(
            [
                (
                    "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, "
                    f"lease_owner = NULL, lease_until = NULL WHERE {HELD} "
                    "AND status IN ('validating', 'cancelling')",
                    (now, json.dumps(errors), batch_id, owner),
                )
            ]
        )
        return changed[0] > 0

    async def set_finalizing(self, batch_id: str, owner: str, now: int) -> bool:
        changed = await self.db.atomic(
            [
                (
                    f"UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE {HELD} "
                    "AND status = 'in_progress'",
                    (now, batch_id, owner),
                )
            ]
        )
        return changed[0] > 0

    async def running_lines(self, batch_id: str) -> list[Line]:
        """Lines claimed but never finished (their runner is gone)."""
        rows = await self.db.select(
            "SELECT line_no, custom_id, body FROM batch_lines WHERE batch_id = ? "
            "AND state = 'running' ORDER BY line_no",
            (batch_id,),
        )
        return [Line(*r) for r in rows]

    @abstractmethod
    async def claim_line(self, batch_id: str, owner: str, now: float) -> Line | None:
        """Mark the next pending line ``running`` (durably) and return it; None when there is none, or
        the batch is no longer ``in_progress``, or the lease is not ours."""

    async def finish_line(
        self, batch_id: str, line_no: int, owner: str | None, outcome: Outcome, now: float
    ) -> bool:
        """A claimed line's result, counted in the batch; only if it is still ``running`` (and, with an
        ``owner``, claimed by it). ``owner=None``: any claim (the lease holder failing a dead claim)."""
        t = outcome.tokens
        changed = await self.db.atomic(
            [
                (
                    "UPDATE batch_lines SET state = ?, result = ?, finished_at = ? WHERE batch_id = ? AND line_no = ? "
                    "AND state = 'running' AND (CAST(? AS TEXT) IS NULL OR owner = ?)",
                    (
                        "done" if outcome.ok else "failed",
                        outcome.result,
                        now,
                        batch_id,
                        line_no,
                        owner,
                        owner,
                    ),
                ),
                (
                    "UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?, "
                    "output_tokens = output_tokens + ?, cached_tokens = cached_tokens + ?, "
                    "reasoning_tokens = reasoning_tokens + ? WHERE id = ?",
                    (
                        int(outcome.ok),
                        int(not outcome.ok),
                        t.input,
                        t.output,
                        t.cached,
                        t.reasoning,
                        batch_id,
                    ),
                ),
            ],
            chained=True,
        )
        return changed[0] > 0

    async def line_states(self, batch_id: str) -> list[LineState]:
        rows = await self.db.select(
            "SELECT line_no, custom_id, state, result FROM batch_lines WHERE batch_id = ? ORDER BY line_no",
            (batch_id,),
        )
        return [LineState(*r) for r in rows]

    async def failed_lines(self, batch_id: str, limit: int) -> list[LineState]:
        """The first ``limit`` failed lines of a batch, with their error lines."""
        rows = await self.db.select(
            "SELECT line_no, custom_id, state, result FROM batch_lines WHERE batch_id = ? "
            "AND state = 'failed' ORDER BY line_no LIMIT ?",
            (batch_id, limit),
        )
        return [LineState(*r) for r in rows]

    async def finalize(self, batch_id: str, owner: str, final: Final) -> bool:
        """The end: create the output and error files, set the final status, counts and file ids, drop
        the lines and the lease — all at once."""
        stamp = ENDED_AT[final.status]  # the column, from our own names (a KeyError for another status)
        output, error = final.output, final.error
        changed = await self.db.atomic(
            [
                (
                    f"UPDATE batches SET status = ?, {stamp} = ?, completed = ?, failed = ?, output_file_id = ?, "
                    f"error_file_id = ?, lease_owner = NULL, lease_until = NULL WHERE {HELD} AND {OPEN_SQL}",
                    (
                        final.status,
                        final.at,
                        final.completed,
                        final.failed,
                        output.id if output else None,
                        error.id if error else None,
                        batch_id,
                        owner,
                    ),
                ),
                *(self.file_insert(file, data) for file, data in final.files),
                ("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,)),
            ],
            chained=True,
        )
        return changed[0] > 0


_BATCH = f"SELECT {', '.join(BATCH_COLUMNS)} FROM batches"
_FILE = f"SELECT {', '.join(FILE_COLUMNS)} FROM files"
HELD = "id = ? AND lease_owner = ?"  # a write by the lease holder only
OPEN_SQL = f"status IN ({', '.join(repr(s) for s in OPEN)})"
_PRINCIPAL_BY_ID = principal_query("id", "?")


def _marks(columns: tuple[str, ...]) -> str:
    return ", ".join("?" * len(columns))


def _where(*clauses: tuple[Any, ...]) -> tuple[str, list[Any]]:
    """The clauses whose values are not None, and their values (``1 = 1`` if none)."""
    where, args = ["1 = 1"], []
    for clause, *values in clauses:
        if values[0] is not None:
            where.append(clause)
            args += values
    return " AND ".join(where), args


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)
