"""The jobs store on PostgreSQL: the billing store's pool (:class:`billing.postgres_pool.PostgresPool`),
the same tables as :mod:`jobs.sqlite`, file contents as ``bytea``. Migrations run on open under an
advisory lock (its own lock id and ``jobs_schema_version`` table), so replicas starting together
migrate once.

Leases use the database clock, so every replica agrees on when one has run out. A batch is claimed
with ``FOR UPDATE SKIP LOCKED``: two replicas looking at once never take the same batch.
"""

from __future__ import annotations

from typing import Any

from billing.postgres_pool import PostgresPool
from jobs.store import (
    BATCH_COLUMNS,
    FILE_COLUMNS,
    OPEN_SQL,
    BatchRow,
    FileRow,
    GroupLoad,
    JobStore,
    Line,
    batch_of,
    migrations,
)

MIGRATION_LOCK = 0x6A6F62732D7631  # advisory lock id held (per transaction) while the jobs schema migrates
NOW = "extract(epoch FROM clock_timestamp())::float8"

MIGRATIONS = migrations("postgresql")

_INSERT_FILE = (
    f"INSERT INTO files ({', '.join(FILE_COLUMNS)}, data) VALUES ({', '.join('?' * (len(FILE_COLUMNS) + 1))})"
)


def _count(status: str) -> int:
    """Rows touched, from asyncpg's command tag (``UPDATE 3``)."""
    return int(status.rsplit(" ", 1)[-1])


class PostgresJobStore(JobStore):
    def __init__(self, pool: PostgresPool) -> None:
        self.pool = pool

    @property
    def db(self) -> PostgresPool:
        return self.pool

    async def open(self) -> None:
        await self.pool.migrate("jobs_schema_version", MIGRATIONS, MIGRATION_LOCK)

    # -- files ----------------------------------------------------------------------------------------
    def file_insert(self, row: FileRow, data: bytes) -> tuple[str, tuple[Any, ...]]:
        return _INSERT_FILE, (*row.values(), data)

    async def file_content(self, group_id: int, file_id: str) -> bytes | None:
        data = await self.pool.fetchval(
            "SELECT data FROM files WHERE id = $1 AND group_id = $2", file_id, group_id
        )
        return bytes(data) if data is not None else None

    # -- leases ---------------------------------------------------------------------------------------
    async def claim_batch(self, owner: str, lease: float, skip: list[str]) -> BatchRow | None:
        row = await self.pool.fetchrow(
            f"UPDATE batches SET lease_owner = $1, lease_until = {NOW} + $2 WHERE seq = ("
            f"SELECT seq FROM batches b WHERE {OPEN_SQL} AND (lease_until IS NULL OR lease_until < {NOW}) "
            "AND NOT (id = ANY($3::text[])) ORDER BY (SELECT count(*) FROM batches r WHERE r.group_id = b.group_id "
            f"AND r.{OPEN_SQL} AND r.lease_until >= {NOW}), seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"RETURNING {', '.join(BATCH_COLUMNS)}",
            owner,
            lease,
            skip,
        )
        return batch_of(row) if row else None

    async def batch_load(self, skip: list[str]) -> dict[int, GroupLoad]:
        rows = await self.pool.fetch(
            f"SELECT group_id, count(*) FILTER (WHERE lease_until >= {NOW}), count(*) FILTER (WHERE "
            f"(lease_until IS NULL OR lease_until < {NOW}) AND NOT (id = ANY($1::text[]))) "
            f"FROM batches WHERE {OPEN_SQL} GROUP BY group_id",
            skip,
        )
        return {int(row[0]): GroupLoad(int(row[1]), int(row[2])) for row in rows}

    async def renew(self, batch_id: str, owner: str, lease: float) -> str | None:
        status = await self.pool.fetchval(
            f"UPDATE batches SET lease_until = {NOW} + $3 WHERE id = $1 AND lease_owner = $2 AND {OPEN_SQL} "
            "RETURNING status",
            batch_id,
            owner,
            lease,
        )
        return str(status) if status is not None else None

    # -- the run of one batch -------------------------------------------------------------------------
    async def start_batch(self, batch_id: str, owner: str, lines: list[Line], now: int) -> bool:
        async with self.pool.transaction() as conn:
            status = await conn.execute(
                "UPDATE batches SET status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, "
                "in_progress_at = $1, total = $2 WHERE id = $3 AND lease_owner = $4 "
                "AND status IN ('validating', 'cancelling') AND total = 0 "
                "AND NOT EXISTS (SELECT 1 FROM batch_lines WHERE batch_id = $3)",
                now,
                len(lines),
                batch_id,
                owner,
            )
            if _count(status) == 0:
                return False
            await conn.copy_records_to_table(
                "batch_lines",
                records=[(batch_id, line.line_no, line.custom_id, line.body) for line in lines],
                columns=["batch_id", "line_no", "custom_id", "body"],
            )
        return True

    async def claim_line(self, batch_id: str, owner: str, now: float) -> Line | None:
        row = await self.pool.fetchrow(
            "UPDATE batch_lines SET state = 'running', owner = $2, started_at = $3 "
            "WHERE batch_id = $1 AND line_no = (SELECT line_no FROM batch_lines WHERE batch_id = $1 "
            "AND state = 'pending' ORDER BY line_no LIMIT 1 FOR UPDATE SKIP LOCKED) "
            "AND EXISTS (SELECT 1 FROM batches WHERE id = $1 AND lease_owner = $2 AND status = 'in_progress') "
            "RETURNING line_no, custom_id, body",
            batch_id,
            owner,
            now,
        )
        return Line(*row) if row else None
