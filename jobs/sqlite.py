"""The jobs store on SQLite: the billing store's database handle (its connection and worker thread,
:class:`billing.sqlite_thread.SQLiteThread`), with its own schema version (``jobs_schema_version``).
File contents live on disk in the files directory (written to a temporary name, flushed, then
renamed); the database holds their rows.

That connection is ``synchronous=FULL``: a line's claim is on disk before its call goes upstream, so
not even a power cut can make a line run twice.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from billing.sqlite_thread import SQLiteThread
from billing.store import Principal, principal_query, principal_row
from jobs.store import (
    BATCH_COLUMNS,
    FILE_COLUMNS,
    OPEN,
    TIMESTAMPS,
    BatchRow,
    FileRow,
    Final,
    GroupLoad,
    JobStore,
    JobStoreError,
    Line,
    Outcome,
    batch_of,
    file_of,
)

T = TypeVar("T")
_PRINCIPAL_BY_ID = principal_query("id", "?")

MIGRATIONS: list[str] = [
    # 1: files, batches, batch lines
    """
    CREATE TABLE files (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        group_id INTEGER NOT NULL,
        key_id INTEGER NOT NULL,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER
    );
    CREATE INDEX files_group ON files(group_id, seq);
    CREATE TABLE batches (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        group_id INTEGER NOT NULL,
        key_id INTEGER NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        metadata TEXT,
        errors TEXT,
        in_progress_at INTEGER,
        finalizing_at INTEGER,
        completed_at INTEGER,
        failed_at INTEGER,
        expired_at INTEGER,
        cancelling_at INTEGER,
        cancelled_at INTEGER,
        output_file_id TEXT,
        error_file_id TEXT,
        total INTEGER NOT NULL DEFAULT 0,
        completed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        reasoning_tokens INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_until REAL
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
        started_at REAL,
        finished_at REAL,
        result TEXT,
        PRIMARY KEY (batch_id, line_no)
    );
    CREATE INDEX batch_lines_state ON batch_lines(batch_id, state, line_no);
    """,
]

_BATCH = f"SELECT {', '.join(BATCH_COLUMNS)} FROM batches"
_FILE = f"SELECT {', '.join(FILE_COLUMNS)} FROM files"
_HELD = "id = ? AND lease_owner = ?"  # a write by the lease holder only
_OPEN = f"status IN ({', '.join(repr(s) for s in OPEN)})"


class SQLiteJobStore(JobStore):
    def __init__(self, thread: SQLiteThread, files_dir: str = "") -> None:
        self.thread = thread
        base = Path(thread.path).parent if thread.path != ":memory:" else Path("data")
        self.files_dir = Path(files_dir) if files_dir else base / "files"

    # -- plumbing -------------------------------------------------------------------------------------
    @property
    def db(self) -> SQLiteThread:
        if not self.thread.is_open:
            raise JobStoreError("the jobs store is not open")
        return self.thread

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if not self.thread.is_open:
            raise JobStoreError("the jobs store is not open")
        return await self.thread.run(fn)

    async def tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one write transaction (taken at once, so the checks it reads stay true)."""

        def wrapped(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
                db.execute("COMMIT")
                return out
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return await self.run(wrapped)

    async def open(self) -> None:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        if not self.thread.is_open:
            raise JobStoreError("the billing store's database is not open")
        await self.thread.migrate("jobs_schema_version", MIGRATIONS)

    def _file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def _write_file(self, file_id: str, data: bytes) -> None:
        path = self._file_path(file_id)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def _write_file_on(self, file_id: str, data: bytes, db: sqlite3.Connection) -> None:
        """``_write_file`` as a job of the store's thread (which serialises it with the commits)."""
        self._write_file(file_id, data)

    # -- callers --------------------------------------------------------------------------------------
    async def principal_by_id(self, key_id: int) -> Principal | None:
        return await self.run(lambda db: principal_row(db.execute(_PRINCIPAL_BY_ID, (key_id,)).fetchone()))

    # -- files ----------------------------------------------------------------------------------------
    async def create_file(self, row: FileRow, data: bytes) -> None:
        def fn(db: sqlite3.Connection) -> None:
            self._write_file(row.id, data)
            db.execute(
                f"INSERT INTO files ({', '.join(FILE_COLUMNS)}) VALUES ({', '.join('?' * len(FILE_COLUMNS))})",
                tuple(getattr(row, name) for name in FILE_COLUMNS),
            )

        await self.run(fn)

    async def get_file(self, group_id: int, file_id: str) -> FileRow | None:
        def fn(db: sqlite3.Connection) -> FileRow | None:
            row = db.execute(_FILE + " WHERE id = ? AND group_id = ?", (file_id, group_id)).fetchone()
            return file_of(row) if row else None

        return await self.run(fn)

    async def file_content(self, group_id: int, file_id: str) -> bytes | None:
        def fn(db: sqlite3.Connection) -> bytes | None:
            row = db.execute("SELECT 1 FROM files WHERE id = ? AND group_id = ?", (file_id, group_id)).fetchone()
            if row is None:
                return None
            try:
                return self._file_path(file_id).read_bytes()
            except FileNotFoundError:
                return None

        return await self.run(fn)

    async def list_files(self, group_id: int, purpose: str | None, after: str | None, limit: int,
                         ascending: bool) -> list[FileRow]:  # fmt: skip
        def fn(db: sqlite3.Connection) -> list[FileRow]:
            sql = _FILE + " WHERE group_id = ?"
            args: list[Any] = [group_id]
            if purpose is not None:
                sql += " AND purpose = ?"
                args.append(purpose)
            if after is not None:
                cmp = ">" if ascending else "<"
                sql += f" AND seq {cmp} (SELECT seq FROM files WHERE id = ? AND group_id = ?)"
                args += [after, group_id]
            sql += f" ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?"
            return [file_of(r) for r in db.execute(sql, (*args, limit)).fetchall()]

        return await self.run(fn)

    async def delete_file(self, group_id: int, file_id: str) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            gone = db.execute("DELETE FROM files WHERE id = ? AND group_id = ?", (file_id, group_id)).rowcount > 0
            if gone:
                self._file_path(file_id).unlink(missing_ok=True)
            return gone

        return await self.run(fn)

    # -- batches --------------------------------------------------------------------------------------
    # -- leases ---------------------------------------------------------------------------------------
    async def claim_batch(self, owner: str, lease: float, skip: list[str]) -> BatchRow | None:
        marks = ", ".join("?" * len(skip))
        free = (
            f"SELECT id FROM batches b WHERE {_OPEN} AND (lease_until IS NULL OR lease_until < ?)"
            + (f" AND id NOT IN ({marks})" if skip else "")
            + f" ORDER BY (SELECT count(*) FROM batches r WHERE r.group_id = b.group_id AND r.{_OPEN} "
            "AND r.lease_until >= ?), seq LIMIT 1"
        )
        # look first without the write lock (a poll that finds nothing never delays the ledger's writes)
        if await self.run(lambda db: db.execute(free, (time.time(), *skip, time.time())).fetchone()) is None:
            return None

        def fn(db: sqlite3.Connection) -> BatchRow | None:
            now = time.time()
            row = db.execute(free, (now, *skip, now)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ?", (owner, now + lease, row[0]))
            return batch_of(db.execute(_BATCH + " WHERE id = ?", (row[0],)).fetchone())

        return await self.tx(fn)

    async def batch_load(self, skip: list[str]) -> dict[int, GroupLoad]:
        marks = ", ".join("?" * len(skip))
        sql = (
            "SELECT group_id, sum(lease_until >= ?), "
            f"sum((lease_until IS NULL OR lease_until < ?){f' AND id NOT IN ({marks})' if skip else ''}) "
            f"FROM batches WHERE {_OPEN} GROUP BY group_id"
        )

        def fn(db: sqlite3.Connection) -> dict[int, GroupLoad]:
            now = time.time()
            rows = db.execute(sql, (now, now, *skip)).fetchall()
            return {int(g): GroupLoad(int(running or 0), int(waiting or 0)) for g, running, waiting in rows}

        return await self.run(fn)

    async def renew(self, batch_id: str, owner: str, lease: float) -> str | None:
        def fn(db: sqlite3.Connection) -> str | None:
            cur = db.execute(
                f"UPDATE batches SET lease_until = ? WHERE {_HELD} AND {_OPEN}", (time.time() + lease, batch_id, owner)
            )
            if cur.rowcount == 0:
                return None
            return str(db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])

        return await self.tx(fn)

    # -- the run of one batch -------------------------------------------------------------------------
    async def start_batch(self, batch_id: str, owner: str, lines: list[Line], now: int) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE batches SET status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, "
                f"in_progress_at = ?, total = ? WHERE {_HELD} AND status IN ('validating', 'cancelling') "
                "AND total = 0 AND NOT EXISTS (SELECT 1 FROM batch_lines WHERE batch_id = ?)",
                (now, len(lines), batch_id, owner, batch_id),
            )
            if cur.rowcount == 0:
                return False
            db.executemany(
                "INSERT INTO batch_lines (batch_id, line_no, custom_id, body) VALUES (?, ?, ?, ?)",
                [(batch_id, line.line_no, line.custom_id, line.body) for line in lines],
            )
            return True

        return await self.tx(fn)

    async def fail_batch(self, batch_id: str, owner: str, errors: list[dict[str, Any]], now: int) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            return db.execute(
                "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, lease_owner = NULL, "
                f"lease_until = NULL WHERE {_HELD} AND status IN ('validating', 'cancelling')",
                (now, json.dumps(errors), batch_id, owner),
            ).rowcount > 0

        return await self.tx(fn)

    async def claim_line(self, batch_id: str, owner: str, now: float) -> Line | None:
        def fn(db: sqlite3.Connection) -> Line | None:
            held = db.execute(f"SELECT 1 FROM batches WHERE {_HELD} AND status = 'in_progress'", (batch_id, owner))
            if held.fetchone() is None:
                return None
            row = db.execute(
                "SELECT line_no, custom_id, body FROM batch_lines WHERE batch_id = ? AND state = 'pending' "
                "ORDER BY line_no LIMIT 1",
                (batch_id,),
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE batch_lines SET state = 'running', owner = ?, started_at = ? WHERE batch_id = ? AND line_no = ?",
                (owner, now, batch_id, row[0]),
            )
            return Line(*row)

        return await self.tx(fn)

    async def finish_line(self, batch_id: str, line_no: int, owner: str | None, outcome: Outcome,
                          now: float) -> bool:  # fmt: skip
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE batch_lines SET state = ?, result = ?, finished_at = ? WHERE batch_id = ? AND line_no = ? "
                "AND state = 'running' AND (? IS NULL OR owner = ?)",
                ("done" if outcome.ok else "failed", outcome.result, now, batch_id, line_no, owner, owner),
            )
            if cur.rowcount == 0:
                return False
            t = outcome.tokens
            db.execute(
                "UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?, "
                "output_tokens = output_tokens + ?, cached_tokens = cached_tokens + ?, "
                "reasoning_tokens = reasoning_tokens + ? WHERE id = ?",
                (int(outcome.ok), int(not outcome.ok), t.input, t.output, t.cached, t.reasoning, batch_id),
            )
            return True

        return await self.tx(fn)

    async def finalize(self, batch_id: str, owner: str, final: Final) -> bool:
        # the files go to disk first: a crash before the commit leaves at most an unreferenced file
        for file, data in ((final.output, final.output_data), (final.error, final.error_data)):
            if file is not None:
                await self.run(partial(self._write_file_on, file.id, data))
        stamp = f"{final.status}_at"
        assert stamp in TIMESTAMPS

        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, completed = ?, failed = ?, output_file_id = ?, "
                f"error_file_id = ?, lease_owner = NULL, lease_until = NULL WHERE {_HELD} AND {_OPEN}",
                (final.status, final.at, final.completed, final.failed, final.output.id if final.output else None,
                 final.error.id if final.error else None, batch_id, owner),
            )  # fmt: skip
            if cur.rowcount == 0:
                return False
            for file in (final.output, final.error):
                if file is not None:
                    db.execute(
                        f"INSERT INTO files ({', '.join(FILE_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(FILE_COLUMNS))})",
                        tuple(getattr(file, name) for name in FILE_COLUMNS),
                    )
            db.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            return True

        done = await self.tx(fn)
        if not done:
            for file in (final.output, final.error):
                if file is not None:
                    self._file_path(file.id).unlink(missing_ok=True)
        return done
