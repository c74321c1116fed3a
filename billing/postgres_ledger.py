"""The PostgreSQL store's ledger: reservations and settlements by group commit.

Reservations and settlements go through group commit: reservations and settlements queue up while a batch is being
committed, then the next batch does them all in one transaction (one WAL flush for dozens of calls;
a transaction per reservation would hold the group's row lock through its own flush, so one busy
group could not go past the disk's flush rate). A settlement nobody waits for (``linger``) lets the
batch wait up to 20 ms for more, unless a reservation (somebody waits for it) comes first. A batch
is four round trips:

1. ``BEGIN``;
2. ``LOCK``: delete the reservations it settles, then lock the key rows, then the group rows it
   touches (each in id order) and read them;
3. work out every operation in Python, one after the other in the order they were submitted, with the
   SQLite store's arithmetic (a reservation needs the key's cap and the group's balance; a charge is
   capped at what the group has);
4. ``APPLY``: the net change of each group with one conditional ``UPDATE`` (``WHERE balance + change
   >= 0``), of each key, the new reservations and the usage records; then ``COMMIT``.

The rows are locked before they are read, so no replica can move a balance between the reading and
the writing; ``CHECK (balance >= 0)`` is the last guard. Every transaction takes its locks in the
same order (reservations, keys, groups; ``reconcile`` takes reservations last, but with ``SKIP
LOCKED``, so it never waits for one): replicas cannot deadlock each other, and if PostgreSQL still
reported a deadlock the batch would be redone. An operation that fails (an unknown key, say) does
not fail the others: the batch is rolled back and redone one operation per transaction.

Timestamps of reservations come from the database clock, so ``reconcile(older_than=...)`` means the
same on every replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from billing import budgets
from billing.postgres_pool import PostgresPool, down, lost, pg_sql
from billing.store import (
    USAGE_COLUMNS,
    USAGE_LIST,
    USAGE_TYPES,
    Hold,
    Refusal,
    Reservation,
    Store,
    StoreError,
    UsageRecord,
    usage_values,
)
from core.clock import Clock

_PG = {"int": "int8", "str": "text", "float": "float8", "bool": "bool", "float | None": "float8",
       "str | None": "text"}  # fmt: skip
USAGE_PG = tuple(_PG[USAGE_TYPES[name]] for name in USAGE_COLUMNS)  # the usage columns' types, in order
NOW = "extract(epoch FROM now())::float8"

# -- the statements of a ledger batch -----------------------------------------------------------------
# Delete the reservations being settled, then lock the keys, then the groups, each in id order, in one
# round trip. The order is certain: each step's WHERE needs a count of the step before (an InitPlan,
# run in full before the first row of the step is locked), and Append reads its branches in turn.
LOCK = """
WITH released AS (
    DELETE FROM reservations WHERE id IN
        (SELECT id FROM reservations WHERE id = ANY($1::int8[]) ORDER BY id FOR UPDATE)
    RETURNING id
), k AS MATERIALIZED (
    SELECT id, spend_cap, spent, reserved FROM keys
    WHERE id = ANY($2::int8[]) AND (SELECT count(*) FROM released) >= 0
    ORDER BY id FOR NO KEY UPDATE
), g AS MATERIALIZED (
    SELECT id, balance, reserved, spent FROM groups
    WHERE id = ANY($3::int8[]) AND (SELECT count(*) FROM k) >= 0
    ORDER BY id FOR NO KEY UPDATE
)
SELECT 'r' AS kind, id, NULL::int8 AS a, NULL::int8 AS b, NULL::int8 AS c FROM released
UNION ALL SELECT 'k', id, spend_cap, spent, reserved FROM k
UNION ALL SELECT 'g', id, balance, reserved, spent FROM g
"""
_USAGE_ARGS = ", ".join(f"${n}::{kind}[]" for n, kind in enumerate(USAGE_PG, start=12))
_HOLDS = 12 + len(USAGE_PG)  # then the replica and each new reservation's model, provider and request id
APPLY = f"""
WITH g AS (
    UPDATE groups AS g SET balance = g.balance + d.balance, reserved = g.reserved + d.reserved,
                           spent = g.spent + d.spent
    FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[]) AS d(id, balance, reserved, spent)
    WHERE g.id = d.id AND g.balance + d.balance >= 0
    RETURNING g.id
), k AS (
    UPDATE keys AS k SET reserved = k.reserved + d.reserved, spent = k.spent + d.spent
    FROM unnest($5::int8[], $6::int8[], $7::int8[]) AS d(id, reserved, spent)
    WHERE k.id = d.id
    RETURNING k.id
), r AS (
    INSERT INTO reservations (group_id, key_id, amount, created_at, replica, model, provider, request_id)
    SELECT x.group_id, x.key_id, x.amount, {NOW}, ${_HOLDS}::text, x.model, x.provider, x.request_id
    FROM unnest($8::int8[], $9::int8[], $10::int8[], ${_HOLDS + 1}::text[], ${_HOLDS + 2}::text[],
                ${_HOLDS + 3}::text[]) WITH ORDINALITY AS x(group_id, key_id, amount, model, provider, request_id, n)
    ORDER BY x.n
    RETURNING id
), u AS (
    INSERT INTO usage ({USAGE_LIST})
    SELECT {USAGE_LIST} FROM unnest({_USAGE_ARGS}) WITH ORDINALITY AS x({USAGE_LIST}, n)
    ORDER BY x.n
)
SELECT (SELECT count(*) FROM g) AS groups, (SELECT count(*) FROM k) AS keys,
       array(SELECT id FROM r ORDER BY id) AS reservations, $11::int AS batch
"""
STALE = (
    "SELECT id FROM reservations WHERE id > $1 AND ($2::float8 IS NULL OR created_at <= "
    f"{NOW} - $2::float8) ORDER BY id LIMIT $3"
)
TAKE_STALE = (
    "DELETE FROM reservations WHERE id IN "
    "(SELECT id FROM reservations WHERE id = ANY($1::int8[]) ORDER BY id FOR UPDATE SKIP LOCKED) "
    "RETURNING id, group_id, key_id, amount, model, provider, request_id"
)
INTERRUPTED = "reservation left by a stopped process, released on restart"
CUT = "reservation whose commit was cut off with the connection (its call was refused), released"
APPLIED = (
    f"INSERT INTO journal_applied (id, ts) SELECT unnest($1::text[]), {NOW} ON CONFLICT (id) DO NOTHING RETURNING id"
)
RETRIES = 5  # a batch that hits a deadlock (only possible with exotic call patterns) is redone
RECONCILE_CHUNK = 500


# -- one batch, worked out in Python ------------------------------------------------------------------
@dataclass(slots=True)
class ReserveOp:
    group_id: int
    key_id: int
    amount: int
    hold: Hold | None = None


@dataclass(slots=True)
class SettleOp:
    reservation: Reservation
    record: UsageRecord
    once: bool = False  # a retry: skip it if its reservation is gone (an earlier try committed)
    credits: int = -1  # the record's credits when it was queued (set from it)

    def __post_init__(self) -> None:
        self.credits = self.record.credits


Op = ReserveOp | SettleOp


@dataclass(slots=True)
class Row:
    """A locked group (balance, reserved, spent) or key (spend_cap in ``cap``, spent, reserved) row."""

    balance: int = 0
    reserved: int = 0
    spent: int = 0
    cap: int | None = None


@dataclass(slots=True)
class Plan:
    """What a batch does to the rows it has locked: each operation in turn, as the SQLite store would
    do it; the net changes are then written at once."""

    released: set[int]  # reservations this batch deleted, not yet claimed by a settlement
    keys: dict[int, Row]
    groups: dict[int, Row]
    now: float = field(default_factory=time.time)
    start: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    reservations: list[tuple[int, int, int]] = field(default_factory=list)
    holds: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)
    usage: list[tuple[Any, ...]] = field(default_factory=list)
    windows: budgets.Windows | None = None  # the budgets of the groups locked, and their spend

    def remember(self) -> None:
        """Note the rows as read, to write only the net changes at the end."""
        for kind, rows in (("g", self.groups), ("k", self.keys)):
            for rid, row in rows.items():
                self.start[kind, rid] = (row.balance, row.reserved, row.spent)

    def run(self, op: Op) -> Refusal | int | None:
        """A refusal, the index of a new reservation (reserve) or the charge (settle; None: a retry
        that an earlier try had applied)."""
        if isinstance(op, ReserveOp):
            return self.reserve(op.group_id, op.key_id, op.amount, op.hold)
        return self.settle(op.reservation, op.record, op.once)

    def reserve(self, group_id: int, key_id: int, amount: int, hold: Hold | None = None) -> Refusal | int:
        key = self.keys.get(key_id)
        if key is not None and key.cap is not None and key.spent + key.reserved + amount > key.cap:
            return Refusal("key_cap", max(key.cap - key.spent - key.reserved, 0), amount)
        group = self.groups.get(group_id)
        if group is None or group.balance < amount:
            return Refusal("balance", group.balance if group else 0, amount)
        if key is None:
            raise StoreError(f"no key with id {key_id}")
        if amount < 0:
            raise StoreError("a reservation cannot be negative")
        if self.windows:  # the key's and group's budgets (billing/budgets.py), their rows locked above
            over = self.windows.check(group_id, key_id, group.reserved, key.reserved, amount)
            if over is not None:
                return budget_refusal(over)
        group.balance -= amount
        group.reserved += amount
        key.reserved += amount
        self.reservations.append((group_id, key_id, amount))
        self.holds.append((hold.model, hold.provider, hold.request_id) if hold else (None, None, None))
        return len(self.reservations) - 1

    def settle(self, reservation: Reservation, record: UsageRecord, once: bool = False) -> int | None:
        group = self.groups.get(reservation.group_id)
        if group is None:
            raise StoreError(f"no group with id {reservation.group_id}")
        if once and reservation.id > 0 and reservation.id not in self.released:
            return None  # its reservation is gone: an earlier try of this settlement committed
        held = reservation.amount if reservation.id in self.released else 0  # settled twice, or reconciled
        if group.reserved < held:
            raise StoreError("the reservation holds more than its group has reserved")
        self.released.discard(reservation.id)
        charge = min(record.credits, group.balance + held)
        group.reserved -= held
        group.balance += held - charge
        group.spent += charge
        key = self.keys.get(reservation.key_id)
        if key is not None:
            key.reserved -= held
            key.spent += charge
        self.usage.append(usage_values(record, charge, self.now))
        if self.windows:
            self.windows.charge(reservation.group_id, reservation.key_id, charge)
        return charge

    def args(self, replica: str | None) -> list[Any]:
        """The parameters of ``APPLY``: net changes per group and key, new rows as columns."""
        groups = [(gid, r.balance - b, r.reserved - res, r.spent - s)
                  for gid, r in self.groups.items() for b, res, s in [self.start["g", gid]]]  # fmt: skip
        keys = [(kid, r.reserved - res, r.spent - s)
                for kid, r in self.keys.items() for _, res, s in [self.start["k", kid]]]  # fmt: skip
        groups = [g for g in groups if any(g[1:])]
        keys = [k for k in keys if any(k[1:])]
        return [
            *columns(groups, 4), *columns(keys, 3), *columns(self.reservations, 3),
            len(groups), *columns(self.usage, len(USAGE_COLUMNS)), replica, *columns(self.holds, 3),
        ]  # fmt: skip


def columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


async def run_batch(conn: asyncpg.Connection, ops: Sequence[Op], replica: str | None = None,
                    now: float | None = None) -> list[Any]:  # fmt: skip
    """One transaction for ``ops``; returns each operation's result. Raises if any fails. ``now``: the
    store's clock, for the budget windows."""
    settled = sorted({op.reservation.id for op in ops if isinstance(op, SettleOp)})
    key_ids = sorted({op.key_id if isinstance(op, ReserveOp) else op.reservation.key_id for op in ops})
    group_ids = sorted({op.group_id if isinstance(op, ReserveOp) else op.reservation.group_id for op in ops})
    async with conn.transaction():
        plan = await lock(conn, settled, key_ids, group_ids)
        plan.windows = await read_windows(conn, group_ids, time.time() if now is None else now)
        results = [plan.run(op) for op in ops]
        new_ids = await apply(conn, plan, replica)
        if plan.windows:
            await conn.executemany(ADD_SPEND, plan.windows.rows())
    return [Reservation(new_ids[r], *plan.reservations[r]) if isinstance(op, ReserveOp) and isinstance(r, int)
            else r for op, r in zip(ops, results, strict=True)]  # fmt: skip


async def lock(conn: asyncpg.Connection, settled: list[int], key_ids: list[int], group_ids: list[int],
               ) -> Plan:  # fmt: skip
    """Take the reservations being settled, lock the keys, then the groups, and read them."""
    plan = Plan(set(), {}, {})
    for kind, rid, a, b, c in await conn.fetch(LOCK, settled, key_ids, group_ids):
        if kind == "r":
            plan.released.add(rid)
        elif kind == "k":
            plan.keys[rid] = Row(cap=a, spent=b, reserved=c)
        else:
            plan.groups[rid] = Row(balance=a, reserved=b, spent=c)
    plan.remember()
    return plan


async def apply(conn: asyncpg.Connection, plan: Plan, replica: str | None = None) -> list[int]:
    row = await conn.fetchrow(APPLY, *plan.args(replica))
    assert row is not None
    if row["groups"] != row["batch"]:  # cannot happen: the rows are locked and the plan kept them >= 0
        raise StoreError("a group's balance would go below zero")
    return list(row["reservations"])


ADD_SPEND = pg_sql(budgets.ADD_SPEND)


async def read_windows(conn: asyncpg.Connection, group_ids: list[int], now: float) -> budgets.Windows:
    """The budgets of ``group_ids`` (and of their keys) with their windows' spend, in one round trip.
    Read after the key and group rows are locked: every change of a budget's spend is made holding
    its key's and group's row locks, so no replica can move it until this transaction ends."""
    return budgets.windows_of(await conn.fetch(budgets.READ_PG, int(now), group_ids), now)


def budget_refusal(over: budgets.Exceeded) -> Refusal:
    return Refusal("budget", max(over.budget.amount - over.used, 0), over.needed, over.budget.describe(),
                   over.resets_at)  # fmt: skip


# -- group commit -------------------------------------------------------------------------------------
class LedgerCommits:
    """Many ledger operations, one transaction: operations queue up while a batch commits, then the
    next batch takes them all; every caller awaits its own operation's commit."""

    linger = 0.02  # as the SQLite store's group commit (billing/sqlite.py GroupCommit)

    def __init__(self, db: PostgresPool, limit: int = 1024, owner: Store | None = None,
                 clock: Clock = time.time) -> None:  # fmt: skip
        self.db = db
        self.owner = owner  # the store whose ``rescue`` is offered the settlements that fail
        self.clock = clock  # the budget windows' (core/clock.py)
        self.limit = limit
        self.pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.conn: asyncpg.Connection | None = None  # the batches' own, kept from one batch to the next
        self.batches = 0
        self.replica: str | None = None  # this process's name on the reservations it makes (billing/leases.py)
        # a batch of reservations whose connection was lost may have committed (the COMMIT was on the
        # wire) while its callers were refused: the holds of this replica that no call of it knows
        # are released before the next batch (``live``: the reservations its calls hold)
        self.live: set[int] = set()
        self.suspect = False
        self.began = 0.0  # when the batch being written was first tried
        self._wake: asyncio.Future[None] | None = None  # set to end a linger (see ``submit``)

    def submit(self, op: Op, linger: bool = False) -> asyncio.Future[Any]:
        """Queue ``op`` for the next batch. ``linger``: nobody waits for it, so the batch may wait
        ``linger`` seconds for more; an operation that somebody awaits starts it at once."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append((op, future))
        if self.task is None:
            self.task = loop.create_task(self._drain(self.linger if linger else 0.0))
        elif not linger and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)  # a waiting caller: stop lingering
        return future

    async def close(self) -> None:
        """Once every queued operation is committed (or failed), give the connection back."""
        while self.task is not None:
            await asyncio.wait({self.task})
        if self.conn is not None:
            conn, self.conn = self.conn, None
            await self.db.release(conn)

    async def _connection(self) -> asyncpg.Connection:
        if self.conn is not None and not usable(self.conn):  # lost (server restarted?): take another
            conn, self.conn = self.conn, None
            await self.db.release(conn)  # nothing to do if the pool has taken it back
        if self.conn is None:
            self.conn = await self.db.acquire()
        return self.conn

    def _fail(self, batch: list[tuple[Op, asyncio.Future[Any]]], exc: BaseException) -> None:
        """Fail these operations, offering each first try of a settlement to ``Store.rescue``."""
        rescue = self.owner.rescue if self.owner is not None else None
        if rescue is not None and not isinstance(exc, asyncio.CancelledError):
            batch = [(op, future) for op, future in batch
                     if not (isinstance(op, SettleOp) and not op.once and not future.done()
                             and rescue(op.reservation, op.record, op.credits, self.began, future, exc))]  # fmt: skip
        fail(batch, exc)

    async def _sweep(self, conn: asyncpg.Connection) -> None:
        """Release the holds of this replica that none of its calls knows (see ``suspect``)."""
        from billing.leases import release  # (leases builds on this module)

        rows = await conn.fetch("SELECT id FROM reservations WHERE replica = $1", self.replica)
        orphans = sorted({r[0] for r in rows} - self.live)
        if orphans:
            await release(conn, orphans, CUT)
        self.suspect = False

    async def _drop(self) -> None:
        """Close the batches' connection (lost, or in an unknown state) and give it back to the pool."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.terminate()
            except asyncpg.InterfaceError:  # the pool has taken it back already
                return
            await self.db.release(conn)

    async def _drain(self, linger: float = 0.0) -> None:
        try:
            if linger:
                loop = asyncio.get_running_loop()
                self._wake = wake = loop.create_future()
                timer = loop.call_later(linger, _resolve, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
            while self.pending:
                self.began = time.monotonic()
                conn = await self._connection()
                if self.suspect:
                    await self._sweep(conn)
                batch, self.pending = self.pending[: self.limit], self.pending[self.limit :]
                await self._commit(conn, batch)
        except BaseException as exc:  # no connection (or cancelled): the queued callers get the error
            batch, self.pending = self.pending, []
            self._fail(batch, lost(exc) if down(exc) else exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.task = None

    async def _commit(self, conn: asyncpg.Connection, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        try:
            results = await self._attempt(conn, [op for op, _ in batch])
        except BaseException as exc:  # nothing committed (or, if the connection went during COMMIT,
            # unknown: a settlement's retry finds out, billing/durable.py): every caller gets the error
            if down(exc):
                exc = lost(exc)
                self.suspect = self.suspect or (self.replica is not None and
                                                any(isinstance(op, ReserveOp) for op, _ in batch))  # fmt: skip
                try:
                    await self._drop()
                finally:
                    self._fail(batch, exc)
            else:
                self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.batches += 1
        live = self.live
        for (op, future), (ok, value) in zip(batch, results, strict=True):
            if ok and isinstance(op, SettleOp):
                live.discard(op.reservation.id)
                if value is None:  # a retry that an earlier try had applied
                    value = op.record.credits
                op.record.credits = value  # the actual charge, once it is committed
            elif ok and isinstance(value, Reservation):
                live.add(value.id)
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                self._fail([(op, future)], value)

    async def _attempt(self, conn: asyncpg.Connection, ops: list[Op]) -> list[tuple[bool, Any]]:
        """``(True, result)`` or ``(False, error)`` for each operation. If one fails, the batch is
        rolled back and each operation redone in its own transaction: one failure fails only itself."""
        try:
            return [(True, r) for r in await self._retrying(conn, ops)]
        except (StoreError, asyncpg.PostgresError) as exc:
            if down(exc):  # the connection, not an operation: the whole batch fails
                raise
            if len(ops) == 1:
                return [(False, exc)]
        return [(await self._attempt(conn, [op]))[0] for op in ops]

    async def _retrying(self, conn: asyncpg.Connection, ops: list[Op]) -> list[Any]:
        for attempt in range(1, RETRIES + 1):
            try:
                return await run_batch(conn, ops, self.replica, self.clock())
            except asyncpg.DeadlockDetectedError:
                if attempt == RETRIES:
                    raise
        raise AssertionError("unreachable")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def usable(conn: asyncpg.Connection) -> bool:
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:  # the pool took it back when it was closed
        return False


def fail(batch: list[tuple[Op, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)


