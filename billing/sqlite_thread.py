"""One SQLite connection owned by one worker thread, migrated when it opens.

Every statement runs on that thread (never on the event loop): ``run(fn)`` calls ``fn(connection)``
there. The file is in WAL mode with a busy timeout, so other processes (the CLI beside a gateway)
can share it. ``migrations`` are SQL scripts applied in order, the version kept in ``version_table``.
Used by the billing store and the jobs store, each with its own connection and version table.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SQLiteThread:
    def __init__(self, path: str, *, name: str, migrations: Sequence[str], version_table: str = "schema_version",
                 synchronous: str = "NORMAL", foreign_keys: bool = True) -> None:  # fmt: skip
        self.path = path
        self.name = name
        self.migrations = migrations
        self.version_table = version_table
        self.synchronous = synchronous
        self.foreign_keys = foreign_keys
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None

    @property
    def is_open(self) -> bool:
        return self._executor is not None

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            raise RuntimeError(f"the {self.name} database is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._db is not None
        return fn(self._db)

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._db is not None:
            await self.run(lambda db: db.close())
        self._db = None
        self._executor.shutdown(wait=True)
        self._executor = None

    def _connect(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        if self.foreign_keys:
            db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=10000")
        self._db = db
        self._migrate(db)

    def connect_here(self) -> sqlite3.Connection | None:
        """A second connection, for the calling thread (the event loop's): it never waits for a lock
        (busy timeout 0: the caller hands the work to this store's thread instead) and never
        checkpoints the WAL on its own (``PRAGMA wal_checkpoint`` runs on the thread). None for an
        in-memory database, which another connection would not see."""
        if self.path == ":memory:":
            return None
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        if self.foreign_keys:
            db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=0")
        db.execute("PRAGMA wal_autocheckpoint=0")
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        table = self.version_table
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
            row = db.execute(f"SELECT version FROM {table}").fetchone()
            version = row[0] if row else 0
            if row is None:
                db.execute(f"INSERT INTO {table} VALUES (0)")
            for number, script in enumerate(self.migrations[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"UPDATE {table} SET version = ?", (number,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
