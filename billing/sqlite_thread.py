"""One SQLite connection owned by one worker thread: the database handle of a SQLite store.

Every statement runs on that thread (never on the event loop): ``run(fn)`` calls ``fn(connection)``
there. The file is in WAL mode with a busy timeout, so other processes (the CLI beside a gateway)
can share it. One handle serves everyone on the file: the billing store opens it, and the jobs store
and the console run on the same thread and connection. Each of them migrates its own tables with
``migrate(version_table, scripts)``.

The connection is ``synchronous=FULL``: a batch line's claim (jobs) must be on disk before its call
goes upstream, even through a power cut. The billing store's group commits run on a second connection
of the event loop's own (:meth:`connect_here`), ``synchronous=NORMAL``.

A statement that fails because the database is locked past the busy timeout or cannot be read or
written (I/O error, disk full, file gone) raises :class:`billing.store.StoreDown`; other errors
(constraint violations, SQL mistakes) pass through unchanged.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from billing.store import StoreConstraint, StoreDown

T = TypeVar("T")
BUSY_TIMEOUT_MS = 10_000
# SQLITE_BUSY, LOCKED, READONLY, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB and their extended codes
_DOWN = frozenset({5, 6, 8, 10, 11, 13, 14, 15, 26})


def down(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the database cannot be used now (rather than that a statement is wrong)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DOWN


class SQLiteThread:
    dialect = "sqlite"

    def __init__(self, path: str, *, name: str = "sqlite-store") -> None:
        self.path = path
        self.name = name
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
        try:
            return fn(self._db)
        except sqlite3.Error as exc:
            if down(exc):
                raise StoreDown(f"the SQLite database {self.path} cannot be used now ({exc})") from exc
            raise

    # -- dialect-neutral SQL (``?`` placeholders), for queries shared with PostgreSQL ---------------
    # (a broken constraint is StoreConstraint, as on PostgreSQL)
    async def select(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self.run(lambda db: _constrained(lambda: db.execute(sql, tuple(args)).fetchall()))

    async def write(self, sql: str, args: Sequence[Any] = ()) -> None:
        await self.run(lambda db: _constrained(lambda: db.execute(sql, tuple(args))))

    async def atomic(self, steps: Sequence[tuple[str, Sequence[Any]]], chained: bool = False) -> list[int]:
        """Run the statements in one transaction (all or none); the rows each changed."""
        return await self.run(lambda db: _constrained(lambda: _atomic(db, steps, chained)))

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
        db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._db = db

    def connect_here(self) -> sqlite3.Connection | None:
        """A second connection, for the calling thread (the event loop's): it never waits for a lock
        (busy timeout 0: the caller hands the work to this store's thread instead) and never
        checkpoints the WAL on its own (``PRAGMA wal_checkpoint`` runs on the thread); its temporary
        storage is in memory. None for an in-memory database, which another connection would not see."""
        if self.path == ":memory:":
            return None
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=0")
        db.execute("PRAGMA wal_autocheckpoint=0")
        # a group commit's statement journals in memory: they went to a temporary file, opened, written
        # (~80 pages a batch) and deleted for every batch (what this connection runs is small batches)
        db.execute("PRAGMA temp_store=MEMORY")
        return db

    async def migrate(self, version_table: str, migrations: Sequence[str]) -> None:
        """Apply the scripts of ``migrations`` not yet applied, in order, in one transaction; the
        number applied is kept in ``version_table``."""
        await self.run(lambda db: _migrate(db, version_table, migrations))


def _constrained(work: Callable[[], T]) -> T:
    try:
        return work()
    except sqlite3.IntegrityError as exc:
        raise StoreConstraint(str(exc)) from None


@contextmanager
def transaction(db: sqlite3.Connection, begun: bool = False) -> Iterator[sqlite3.Connection]:
    """A write transaction, its lock taken at once (``BEGIN IMMEDIATE``, unless ``begun``): committed
    when the block ends, rolled back if it (or the commit) raises."""
    if not begun:
        db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


@contextmanager
def savepoint(db: sqlite3.Connection, name: str = "op") -> Iterator[None]:
    """A savepoint in the transaction: released when the block ends; rolled back to (and released) if
    it raises, and the exception goes on, the rest of the transaction kept."""
    db.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        db.execute(f"ROLLBACK TO {name}")
        db.execute(f"RELEASE {name}")
        raise
    db.execute(f"RELEASE {name}")


def _atomic(db: sqlite3.Connection, steps: Sequence[tuple[str, Sequence[Any]]], chained: bool) -> list[int]:
    counts: list[int] = []
    with transaction(db):
        for sql, args in steps:
            counts.append(
                0 if chained and counts and not counts[-1] else db.execute(sql, tuple(args)).rowcount
            )
    return counts


def _migrate(db: sqlite3.Connection, table: str, migrations: Sequence[str]) -> None:
    with transaction(db):
        db.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
        row = db.execute(f"SELECT version FROM {table}").fetchone()
        version = row[0] if row else 0
        if row is None:
            db.execute(f"INSERT INTO {table} VALUES (0)")
        for number, script in enumerate(migrations[version:], start=version + 1):
            for statement in script.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"UPDATE {table} SET version = ?", (number,))
