"""PostgreSQL store: several gateway replicas share one database. Same tables, same results as
:mod:`billing.sqlite`, on one asyncpg pool (:class:`billing.postgres_pool.PostgresPool`) that the
jobs store and the console share. Reservations and settlements go through the ledger's group commit
(:mod:`billing.postgres_ledger`); everything else is a statement or a short transaction on the pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import asyncpg

from billing import budgets, end_users, rollup
from billing.history import History
from billing.leases import Leases
from billing.postgres_ledger import (
    ADD_SPEND,
    APPLIED,
    BATCH_FUNCTION,
    INTERRUPTED,
    RECONCILE_CHUNK,
    STALE,
    LedgerCommits,
    ReserveOp,
    SettleOp,
    apply,
    lock,
    read_windows,
    release,
    released_mark,
)
from billing.postgres_pool import PostgresPool
from billing.postgres_pool import migrate as pool_migrate
from billing.schema import LEDGER, ddl
from billing.store import (
    Checkpoint,
    Hold,
    Principal,
    Refusal,
    Reservation,
    Store,
    StoreError,
    UsageRecord,
    principal_by_hash_query,
    principal_row,
)
from core import metrics

if TYPE_CHECKING:
    from billing.journal import Entry
    from core.config import StoreSettings

log = logging.getLogger("router.store")

_PRINCIPAL_BY_HASH = principal_by_hash_query("$1", "$1")

MIGRATION_LOCK = 0x6D6F64656C2D72  # advisory lock id held (per transaction) while the schema migrates

MIGRATIONS: list[str] = [
    # 1: groups and keys (hot rows: room on their pages for in-place updates); 2: the ledger: reservations
    # in flight and one usage record per call (billing/schema.py), and reservations by age
    ddl("postgresql", LEDGER[0])[0],
    ddl("postgresql", LEDGER[1])[0] + "CREATE INDEX reservations_created ON reservations(created_at);",
    # 3: the usage history's filters as index ranges (billing/history.py); the console used to add
    # them on first use, under other names (kept, renamed)
    """
    ALTER INDEX IF EXISTS console_usage_group_source RENAME TO usage_group_source;
    ALTER INDEX IF EXISTS console_usage_group_model RENAME TO usage_group_model;
    ALTER INDEX IF EXISTS console_usage_key RENAME TO usage_key;
    CREATE INDEX IF NOT EXISTS usage_group_source ON usage(group_id, source, id);
    CREATE INDEX IF NOT EXISTS usage_group_model ON usage(group_id, model, id);
    CREATE INDEX IF NOT EXISTS usage_key ON usage(key_id, id);
    """,
    # 4: the deployment that served each call (a provider's several accounts: core/deployments.py)
    """
    ALTER TABLE usage ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
    CREATE INDEX usage_group_deployment ON usage(group_id, deployment, id);
    """,
    # 5: the error's code, the batch of a job's line and the caller's end user (the request's
    # ``user``) on each record; the history's filters on them, and on status, as index ranges
    """
    ALTER TABLE usage ADD COLUMN error_code TEXT, ADD COLUMN batch_id TEXT, ADD COLUMN end_user TEXT;
    CREATE INDEX usage_group_status ON usage(group_id, status, id);
    CREATE INDEX usage_batch ON usage(batch_id, id) WHERE batch_id IS NOT NULL;
    CREATE INDEX usage_group_user ON usage(group_id, end_user, id) WHERE end_user IS NOT NULL;
    CREATE INDEX usage_request ON usage(request_id);
    """,
    # 6: the rollups of the usage records, for aggregates over long periods (billing/rollup.py)
    rollup.migration(sqlite=False),
    # 7: the rollups keep the deployment too (rebuilt from the usage table at the next refresh)
    rollup.rebuild(sqlite=False),
    # 8: holds as leases (billing/leases.py): each replica's heartbeat, and on each reservation the
    # replica holding it and its call (for the record written if that replica dies); the journaled
    # settlements applied (billing/journal.py), each at most once
    """
    CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat DOUBLE PRECISION NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL
    );
    ALTER TABLE reservations ADD COLUMN replica TEXT, ADD COLUMN model TEXT, ADD COLUMN provider TEXT,
        ADD COLUMN request_id TEXT;
    CREATE INDEX reservations_replica ON reservations(replica, id);
    CREATE TABLE journal_applied (id TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL);
    """,
    # 9: key lifecycle: expiry, tags, owner, last used (batched), the secret a rotation replaced
    """
    ALTER TABLE keys ADD COLUMN expires_at DOUBLE PRECISION, ADD COLUMN tags TEXT,
        ADD COLUMN owner TEXT NOT NULL DEFAULT '', ADD COLUMN last_used_at DOUBLE PRECISION,
        ADD COLUMN prev_hash TEXT, ADD COLUMN prev_until DOUBLE PRECISION;
    CREATE UNIQUE INDEX keys_prev_hash ON keys(prev_hash) WHERE prev_hash IS NOT NULL;
    """,
    # 10: a ledger batch in one round trip (billing/postgres_ledger.py)
    BATCH_FUNCTION,
    # 11: a stream's usage so far on its reservation (billing/progress.py): what the release of a dead
    # replica's hold charges
    """
    ALTER TABLE reservations ADD COLUMN progress TEXT;
    """,
    # 12: each batch's totals kept up to the rollups' watermark (billing/analysis.py, Analysis.batches)
    rollup.BATCH_TOTALS,
    # 13: the attempts of a call that tried more than one deployment, or one more than once
    "ALTER TABLE usage ADD COLUMN attempts TEXT;",
    # 14: a stream's checkpoints keep the text it generated (its tokens counted only if it is cut:
    # billing/progress.py), how many characters of it, and when the last was
    """
    ALTER TABLE reservations ADD COLUMN progress_text TEXT, ADD COLUMN progress_chars INT4,
        ADD COLUMN progress_at DOUBLE PRECISION;
    """,
    # 15: a stream's checkpoints keep the tokens it generated, counted; no text (``progress_text`` holds
    # only what a replica before this one kept: charged when its hold is released)
    """
    ALTER TABLE reservations ADD COLUMN progress_tokens INT4;
    """,
    # 16: each reservation keeps its call's endpoint and whether it streams (the record of a dead
    # replica's hold says them), and the ledger's batch writes them
    "ALTER TABLE reservations ADD COLUMN endpoint TEXT, ADD COLUMN stream BOOLEAN;" + BATCH_FUNCTION,
]
# streams' checkpoints (billing.store.Checkpoint), each on its reservation's row (one its settlement
# deleted meanwhile: nothing): its charge when it has one, its count and time
NOTE_PROGRESS = (
    "UPDATE reservations r SET progress = coalesce(p.charge, r.progress), progress_tokens = p.completion, "
    "progress_at = p.at FROM unnest($1::int8[], $2::text[], $3::int4[], $4::float8[]) "
    "AS p(id, charge, completion, at) WHERE r.id = p.id"
)


async def released_holds(conn: asyncpg.Connection, entries: Sequence[Entry]) -> dict[int, int]:
    """Of these journaled settlements whose reservation is gone, the reservations that were released
    for a stopped process (an ``interrupted`` record, billing/leases.py) rather than settled by an
    earlier try, with what that record charged (its stream's last checkpoint): the rest is still owed."""
    gone = {
        e.reservation.id: e.record.request_id for e in entries if e.reservation.id > 0 and e.record.request_id
    }
    if not gone:
        return {}
    rows = await conn.fetch(
        "SELECT error, credits FROM usage WHERE request_id = ANY($1::text[]) AND status = 'interrupted'",
        sorted(set(gone.values())),
    )
    released = {}
    for rid in gone:
        for error, credits in rows:
            if (error or "").startswith(released_mark(rid)):
                released[rid] = credits
    return released


# -- the store ----------------------------------------------------------------------------------------
async def migrate(conn: asyncpg.Connection) -> None:
    """Bring the schema up to date; replicas starting together take turns on an advisory lock."""
    async with conn.transaction():
        await pool_migrate(conn, MIGRATION_LOCK, "schema_version", MIGRATIONS)
        await pool_migrate(conn, MIGRATION_LOCK, budgets.VERSION_TABLE, ddl("postgresql", budgets.TABLES))
        await pool_migrate(conn, MIGRATION_LOCK, end_users.VERSION_TABLE, end_users.MIGRATIONS["postgres"])


class PostgresStore(Store):
    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self.db = PostgresPool(url, min_size=min_size, max_size=max_size)
        self.history = History(self.db)
        self.commits = LedgerCommits(self.db, owner=self, clock=lambda: self.clock())
        self.leases: Leases | None = None  # once serving (billing/leases.py)

    @property
    def database(self) -> PostgresPool:
        return self.db

    async def open(self) -> None:
        if self.db.is_open:
            return
        await self.db.open()
        try:
            await self.db.migrate("schema_version", MIGRATIONS, MIGRATION_LOCK)
            await self.db.migrate(budgets.VERSION_TABLE, ddl("postgresql", budgets.TABLES), MIGRATION_LOCK)
            await self.db.migrate(end_users.VERSION_TABLE, end_users.MIGRATIONS["postgres"], MIGRATION_LOCK)
        except BaseException:
            await self.db.close()
            raise

    async def close(self) -> None:
        if self.db.is_open:
            if self.leases is not None:
                await self.leases.stop()
            await self.commits.close()
            if self.leases is not None:
                await self.leases.leave()  # every hold of this replica settled: its row goes
                self.leases = None
            await self.db.close()

    async def serve(self, settings: StoreSettings) -> None:
        """Release the holds older than ``stale_reservation_seconds`` (a crash's, whoever held them),
        then take part in the leases: heartbeat, and release the holds of replicas that stopped."""
        await self.reconcile(older_than=settings.stale_reservation_seconds)
        self.leases = Leases(self.db, grace=settings.lease_grace_seconds, every=settings.heartbeat_seconds)
        self.commits.replica = self.leases.replica
        await self.leases.start()

    # -- groups ---------------------------------------------------------------------------------
    async def principal(self, key_hash: str) -> Principal | None:
        return principal_row(await self.db.read_row(_PRINCIPAL_BY_HASH, key_hash), key_hash)

    # -- ledger ---------------------------------------------------------------------------------
    async def reserve(
        self,
        group_id: int,
        key_id: int,
        amount: int,
        hold: Hold | None = None,
    ) -> Reservation | Refusal:
        result: Reservation | Refusal = await self.commits.submit(ReserveOp(group_id, key_id, amount, hold))
        return result

    def settle_soon(
        self, reservation: Reservation, record: UsageRecord, linger: bool = False, owed: bool = False
    ) -> asyncio.Future[int]:
        return self.commits.submit(SettleOp(reservation, record), linger)

    async def note_progress(self, progress: list[Checkpoint]) -> None:
        """On the reservations' rows, in one statement."""
        ids, _, charges, completions, ats = zip(*progress, strict=True)
        await self.db.execute(NOTE_PROGRESS, ids, charges, completions, ats)

    def settle_again(self, reservation: Reservation, record: UsageRecord) -> asyncio.Future[int]:
        return self.commits.submit(SettleOp(reservation, record, once=True))

    async def replay(self, entries: Sequence[Entry]) -> dict[str, bool]:
        async with self.db.transaction() as conn:
            fresh = {r[0] for r in await conn.fetch(APPLIED, [e.id for e in entries])}
            todo = [e for e in entries if e.id in fresh]
            plan = await lock(
                conn,
                sorted({e.reservation.id for e in todo if e.reservation.id > 0}),
                sorted({e.reservation.key_id for e in todo}),
                sorted({e.reservation.group_id for e in todo}),
            )
            plan.windows = await read_windows(
                conn, sorted({e.reservation.group_id for e in todo}), self.clock()
            )
            released = await released_holds(conn, [e for e in todo if e.reservation.id not in plan.released])
            done = dict.fromkeys((e.id for e in entries), False)
            for entry in todo:
                once = entry.reservation.id not in released  # a hold released for a stop: charge it now
                record = entry.record
                if not once and released[entry.reservation.id]:  # less what its release charged already
                    record = replace(record, credits=max(record.credits - released[entry.reservation.id], 0))
                try:
                    done[entry.id] = plan.settle(entry.reservation, record, once=once) is not None
                except StoreError as exc:
                    log.error("a journaled settlement was refused (%r): %r", exc, entry.record)
            await apply(conn, plan, self.commits.replica)
            if plan.windows:  # the replayed charges count in their budgets' windows too
                await conn.executemany(ADD_SPEND, plan.windows.rows())
        for entry in todo:
            self.commits.live.discard(entry.reservation.id)
        return done

    async def ledger_state(self, group_id: int, key_id: int) -> tuple[int, int | None]:
        row = await self.db.fetchrow(
            "SELECT g.balance, k.spend_cap - k.spent - k.reserved FROM groups g, keys k "
            "WHERE g.id = $1 AND k.id = $2",
            group_id,
            key_id,
        )
        if row is None:
            raise StoreError(f"no group {group_id} or key {key_id}")
        return row[0], row[1]

    async def reconcile(self, older_than: float | None = None) -> int:
        released = 0
        last = 0
        async with self.db.connection() as conn:
            while True:  # ends: each round looks only past the last id it saw
                ids = [r[0] for r in await conn.fetch(STALE, last, older_than, RECONCILE_CHUNK)]
                if not ids:
                    if released:
                        metrics.holds_released("restart", released)
                    return released
                last = ids[-1]
                released += await release(conn, ids, INTERRUPTED)
