"""The database handle's interface: what :class:`billing.sqlite_thread.SQLiteThread` and
:class:`billing.postgres_pool.PostgresPool` share, for the store (``Store.database``), the usage history
(:mod:`billing.history`), the jobs store and the console. Its own module so that the history reads it
without importing the store interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Database(Protocol):
    """What the stores' database handles share: dialect-neutral SQL with ``?`` placeholders (the usage
    history, the console's settings), on the one handle of the store, and migrations of one owner's
    tables (its scripts, the number applied kept in its own ``version_table``)."""

    dialect: str

    async def migrate(self, version_table: str, migrations: Sequence[str]) -> None: ...

    async def select(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def write(self, sql: str, args: Sequence[Any] = ()) -> None: ...

    async def atomic(self, steps: Sequence[tuple[str, Sequence[Any]]], chained: bool = False) -> list[int]:
        """Run the statements in one transaction (all or none); the rows each changed. ``chained``: a
        statement runs only if the one before changed a row (else it counts 0)."""
        ...
