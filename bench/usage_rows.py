"""Loading usage records in bulk, straight into a store's ``usage`` table (the console bench's million
rows, and the tests of the aggregates): SQLite by ``executemany`` in one transaction on the store's
thread, PostgreSQL by ``COPY``. The records are as the gateway would write them (every column of
``billing.store.USAGE_COLUMNS``), with ids given by the table in the order of the rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from billing.records import USAGE_COLUMNS, USAGE_LIST, UsageRecord, usage_values
from billing.store import Store


def rows_of(records: Iterable[UsageRecord]) -> list[tuple[Any, ...]]:
    return [usage_values(r, r.credits, r.ts) for r in records]


async def load(store: Store, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (values in ``USAGE_COLUMNS`` order) into the store's ``usage`` table."""
    db: Any = store.database
    if db.dialect == "sqlite":
        marks = ", ".join("?" * len(USAGE_COLUMNS))

        def insert(conn: Any) -> None:
            conn.execute("BEGIN")
            conn.executemany(f"INSERT INTO usage ({USAGE_LIST}) VALUES ({marks})", rows)
            conn.execute("COMMIT")

        await db.run(insert)
        return
    async with db.connection() as conn:
        await conn.copy_records_to_table("usage", records=rows, columns=list(USAGE_COLUMNS))
