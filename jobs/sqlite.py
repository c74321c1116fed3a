"""The jobs store on SQLite: the billing store's database handle (its connection and worker thread,
:class:`billing.sqlite_thread.SQLiteThread`), with its own schema version (``jobs_schema_version``).
File contents live on disk in the files directory (written to a temporary name, flushed, then
renamed); the database holds their rows.

That connection is ``synchronous=FULL``: a line's claim is on disk before its call goes upstream, so
not even a power cut can make a line run twice.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from billing.sqlite_thread import SQLiteThread, transaction
from jobs.store import (
    BATCH_COLUMNS,
    HELD,
    OPEN_SQL,
    BatchRow,
    FileRow,
    Final,
    GroupLoad,
    JobStore,
    JobStoreError,
    Line,
    batch_of,
    migrations,
)

T = TypeVar("T")

MIGRATIONS = migrations("sqlite")

_COLUMNS = ", ".join(BATCH_COLUMNS)


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
            with transaction(db):
                return fn(db)

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

    # -- files ----------------------------------------------------------------------------------------
    async def create_file(self, row: FileRow, data: bytes) -> None:
        await self.run(partial(self._write_file_on, row.id, data))  # on disk before its row exists
        await super().create_file(row, data)

    async def file_content(self, group_id: int, file_id: str) -> bytes | None:
        def fn(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT 1 FROM files WHERE id = ? AND group_id = ?", (file_id, group_id)
            ).fetchone()
            if row is None:
                return None
            try:
                return self._file_path(file_id).read_bytes()
            except FileNotFoundError:
                return None

        return await self.run(fn)

    async def delete_file(self, group_id: int, file_id: str) -> bool:
        gone = await super().delete_file(group_id, file_id)
        if gone:
            await self.run(lambda db: self._file_path(file_id).unlink(missing_ok=True))
        return gone

    # -- leases ---------------------------------------------------------------------------------------
    async def claim_batch(self, owner: str, lease: float, skip: list[str]) -> BatchRow | None:
        marks = ", ".join("?" * len(skip))
        free = (
            f"SELECT id FROM batches b WHERE {OPEN_SQL} AND (lease_until IS NULL OR lease_until < ?)"
            + (f" AND id NOT IN ({marks})" if skip else "")
            + f" ORDER BY (SELECT count(*) FROM batches r WHERE r.group_id = b.group_id AND r.{OPEN_SQL} "
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
            return batch_of(
                db.execute(
                    f"UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? RETURNING {_COLUMNS}",
                    (owner, now + lease, row[0]),
                ).fetchone()
            )

        return await self.tx(fn)

    async def batch_load(self, skip: list[str]) -> dict[int, GroupLoad]:
        marks = ", ".join("?" * len(skip))
        sql = (
            "SELECT group_id, sum(lease_until >= ?), "
            f"sum((lease_until IS NULL OR lease_until < ?){f' AND id NOT IN ({marks})' if skip else ''}) "
            f"FROM batches WHERE {OPEN_SQL} GROUP BY group_id"
        )

        def fn(db: sqlite3.Connection) -> dict[int, GroupLoad]:
            now = time.time()
            rows = db.execute(sql, (now, now, *skip)).fetchall()
            return {int(g): GroupLoad(int(running or 0), int(waiting or 0)) for g, running, waiting in rows}

        return await self.run(fn)

    async def renew(self, batch_id: str, owner: str, lease: float) -> str | None:
        rows = await self.db.select(
            f"UPDATE batches SET lease_until = ? WHERE {HELD} AND {OPEN_SQL} RETURNING status",
            (time.time() + lease, batch_id, owner),
        )
        return str(rows[0][0]) if rows else None

    # -- the run of one batch -------------------------------------------------------------------------
    async def start_batch(self, batch_id: str, owner: str, lines: list[Line], now: int) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE batches SET status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, "
                f"in_progress_at = ?, total = ? WHERE {HELD} AND status IN ('validating', 'cancelling') "
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

    async def claim_line(self, batch_id: str, owner: str, now: float) -> Line | None:
        def fn(db: sqlite3.Connection) -> Line | None:
            held = db.execute(
                f"SELECT 1 FROM batches WHERE {HELD} AND status = 'in_progress'", (batch_id, owner)
            )
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

    async def finalize(self, batch_id: str, owner: str, final: Final) -> bool:
        # the files go to disk first: a crash before the commit leaves at most an unreferenced file
        for file, data in final.files:
            await self.run(partial(self._write_file_on, file.id, data))
        done = await super().finalize(batch_id, owner, final)
        if not done:
            for file, _ in final.files:
                self._file_path(file.id).unlink(missing_ok=True)
        return done
