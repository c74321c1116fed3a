"""One asyncpg pool: the database handle of a PostgreSQL store, shared by billing, jobs and the console.

The billing store opens it; the jobs store and the console run their statements on it and migrate
their own tables with ``migrate(lock, version_table, scripts)`` (replicas starting together take
turns on an advisory lock). An error that means the database cannot be reached now (connection
refused, lost or terminated, the server shutting down or starting, too many connections, a timeout)
raises :class:`billing.store.StoreDown`; other errors (constraints, SQL) pass through unchanged.

A connection the server killed while it sat in the pool (``pg_terminate_backend``, a restart) looks
alive until the client has read its close; a statement given it is refused by asyncpg before any of
it is sent (:func:`unsent`). The pool's statements (``fetch``, ``select``, ``write``, ``atomic``, ...)
and ``transaction``'s ``BEGIN`` then go again on another connection (the dead one closed, so at most
``max_size`` times): such a call did nothing. A statement cut off after it was sent may have run, so
it is never sent again (its caller gets the ``StoreDown``), unless it is a read (``read``: a key's
lookup), which changed nothing. The ledger's own connection, kept from batch to batch, has the same
retry (billing/postgres_ledger.py, ``LedgerCommits._commit``).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from billing.store import StoreConstraint, StoreDown

# the server is gone, going, starting, full, read-only (a standby after failover) or cancelled us
_DOWN: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,  # a statement on a connection the server has just cut off
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)


T = TypeVar("T")
# what asyncpg says when it refuses to start an operation on a connection whose server has gone
_REFUSED = ("cannot switch to state", "not connected")


def unsent(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether asyncpg refused a statement on ``conn`` before sending any of it, the connection being
    dead: closed (``InterfaceError``), or with the server's goodbye read and its close not yet (the
    protocol cannot start an operation: ``InternalClientError``). Nothing of that statement ran. A
    connection lost after the statement went out (``ConnectionDoesNotExistError``, a FATAL answer, a
    timeout) is not such a refusal: the statement may have run."""
    if isinstance(exc, asyncpg.InterfaceError):
        return conn.is_closed()
    return isinstance(exc, asyncpg.exceptions.InternalClientError) and str(exc).startswith(_REFUSED)


def down(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be used now (rather than that a statement is wrong)."""
    return isinstance(exc, _DOWN) and not isinstance(exc, StoreDown)


def lost(exc: BaseException, what: str = "PostgreSQL") -> StoreDown:
    return StoreDown(f"{what} cannot be reached ({type(exc).__name__}: {exc})")


def pg_sql(sql: str) -> str:
    """``?`` placeholders to ``$1, $2, ...`` (dialect-neutral SQL has no ``?`` anywhere else)."""
    parts = sql.split("?")
    return "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], start=1)) + parts[-1]


class PostgresPool:
    dialect = "postgresql"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self.min_size = min_size
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreDown("the PostgreSQL store is not open")
        return self._pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(self.url, min_size=self.min_size, max_size=self.max_size)
        except Exception as exc:
            if down(exc) or isinstance(exc, asyncpg.PostgresError):
                raise StoreDown(f"cannot connect to PostgreSQL ({exc})") from exc
            raise

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the pool for several statements (``async with db.connection() as conn``)."""
        try:
            async with self.pool.acquire() as conn:
                yield conn
        except Exception as exc:
            if down(exc):
                raise lost(exc) from exc
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection in a transaction, committed when the block ends (rolled back if it raises). A
        connection found dead at ``BEGIN`` (:func:`unsent`) is replaced by another first."""
        for tries_left in range(self.max_size, -1, -1):
            async with self.connection() as conn:
                xact = conn.transaction()
                try:
                    await xact.start()
                except Exception as exc:
                    if not tries_left or not unsent(exc, conn):
                        raise
                    conn.terminate()  # (the pool connects again in its place)
                    continue
                try:
                    yield conn
                except BaseException:
                    await xact.rollback()
                    raise
                await xact.commit()
                return

    async def acquire(self) -> asyncpg.Connection:
        """A connection kept by its user across many batches (the ledger's); give it back with
        :meth:`release`."""
        try:
            return await self.pool.acquire()
        except Exception as exc:
            if down(exc):
                raise lost(exc) from exc
            raise

    async def release(self, conn: asyncpg.Connection) -> None:
        if self._pool is not None:
            try:
                await self._pool.release(conn)
            except Exception as exc:  # a connection already gone: nothing to give back
                if not down(exc):
                    raise

    async def _call(self, method: str, sql: str, args: Sequence[Any], read: bool = False) -> Any:
        return await self._run(lambda conn: getattr(conn, method)(sql, *args), read)

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], read: bool = False) -> T:
        """``work`` on a connection of the pool; on another if asyncpg refused it on a dead one before
        sending it (:func:`unsent`; in a transaction, any of its statements: the COMMIT was never sent,
        so nothing of it stays), or, for a ``read``, if the connection was lost at all. The pool hands
        out the connections it believes live first: after a kill of them all, the dead ones come one
        after the other, each closed here."""
        try:
            for tries_left in range(self.max_size, -1, -1):
                async with self.pool.acquire() as conn:
                    try:
                        return await work(conn)
                    except Exception as exc:
                        if not tries_left or not (unsent(exc, conn) or (read and down(exc))):
                            raise
                        conn.terminate()  # (the pool connects again in its place)
            raise AssertionError("unreachable")
        except Exception as exc:
            if down(exc):
                raise lost(exc) from exc
            raise

    # native SQL ($1 placeholders), as asyncpg's pool takes it
    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        rows: list[Any] = await self._call("fetch", sql, args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        return await self._call("fetchrow", sql, args)

    async def read_row(self, sql: str, *args: Any) -> Any:
        """``fetchrow`` of a statement that changes nothing: sent again even if it was cut off."""
        return await self._call("fetchrow", sql, args, read=True)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._call("fetchval", sql, args)

    async def execute(self, sql: str, *args: Any) -> str:
        status: str = await self._call("execute", sql, args)
        return status

    # dialect-neutral SQL (``?`` placeholders), for queries shared with SQLite (a broken constraint is
    # StoreConstraint, as on SQLite)
    async def select(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return [tuple(r) for r in await self._call("fetch", pg_sql(sql), args)]
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise StoreConstraint(str(exc)) from None

    async def write(self, sql: str, args: Sequence[Any] = ()) -> None:
        try:
            await self._call("execute", pg_sql(sql), args)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise StoreConstraint(str(exc)) from None

    async def atomic(self, steps: Sequence[tuple[str, Sequence[Any]]], chained: bool = False) -> list[int]:
        """Run the statements in one transaction (all or none); the rows each changed."""

        async def run(conn: asyncpg.Connection) -> list[int]:
            counts: list[int] = []
            async with conn.transaction():
                for sql, args in steps:
                    if chained and counts and not counts[-1]:
                        counts.append(0)
                        continue
                    status = await conn.execute(pg_sql(sql), *args)
                    tail = status.rsplit(" ", 1)[-1]
                    counts.append(int(tail) if tail.isdigit() else 0)
            return counts

        try:
            return await self._run(run)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise StoreConstraint(str(exc)) from None

    async def migrate(self, version_table: str, migrations: Sequence[str], lock: int | None = None) -> None:
        """Bring a schema up to date under an advisory lock (``lock``, else one named after
        ``version_table``: replicas starting together take turns); the number of scripts applied is
        kept in ``version_table``."""
        if lock is None:
            lock = zlib.crc32(version_table.encode())
        async with self.transaction() as conn:
            await migrate(conn, lock, version_table, migrations)


async def migrate(conn: asyncpg.Connection, lock: int, table: str, migrations: Sequence[str]) -> None:
    """On ``conn``, in its transaction: the scripts of ``migrations`` not yet applied, in order."""
    await conn.execute("SELECT pg_advisory_xact_lock($1::int8)", lock)
    await conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
    version = await conn.fetchval(f"SELECT version FROM {table}")
    if version is None:
        version = 0
        await conn.execute(f"INSERT INTO {table} VALUES (0)")
    for number, script in enumerate(migrations[version:], start=version + 1):
        await conn.execute(script)
        await conn.execute(f"UPDATE {table} SET version = $1", number)
