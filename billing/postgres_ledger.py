"""The PostgreSQL store's ledger: reservations and settlements by group commit.

Reservations and settlements go through group commit: reservations and settlements queue up while a batch is being
committed, then the next batch does them all in one transaction (one WAL flush for dozens of calls;
a transaction per reservation would hold the group's row lock through its own flush, so one busy
group could not go past the disk's flush rate). A settlement nobody waits for (``linger``) lets the
batch wait up to 20 ms for more, unless a reservation (somebody waits for it) comes first.

A batch is one statement, ``BATCH``, one round trip and its own transaction (``run_fast``): its
function ``ledger_batch`` (installed by the store's migrations) deletes the reservations it settles,
then locks the key rows, then the group rows it touches (each in id order), works out every
operation one after the other in the order they were submitted, with the SQLite store's arithmetic
(a reservation needs the key's cap and the group's balance; a charge is capped at what the group
has), and writes the rows back and the new reservations; the statement then inserts the usage
records of the settlements with their charges. The operations and the records go as JSON text, not
as a column array each (asyncpg's array encoding was 268k instructions per call).

A batch with a group that has a budget (billing/budgets.py) is done in Python instead
(``run_batch``), five round trips: ``BEGIN``; ``LOCK`` (the same locks, in the same order, and the
rows read); the budgets' windows read; every operation worked out by ``LockedBatch`` (the same arithmetic,
and the budgets'); ``APPLY`` (the net change of each group with one conditional ``UPDATE``, of each
key, the new reservations and the usage records), the windows' spend, ``COMMIT``. ``ledger_batch``
finds such a group once it holds the locks and gives the batch up (``Budgeted``); the group is then
batched in Python for ``BUDGET_HINT`` seconds without asking. ``LOCK``, ``LockedBatch`` and ``APPLY`` also
serve the journal's replay and the release of a dead replica's holds (billing/postgres.py,
billing/leases.py).

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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import asyncpg
import msgspec

from billing import budgets, rules
from billing.postgres_pool import PostgresPool, down, lost, pg_sql, unsent
from billing.progress import charged
from billing.records import USAGE_COLUMNS, USAGE_LIST, USAGE_TYPES, usage_values
from billing.store import (
    Hold,
    Refusal,
    Reservation,
    Store,
    StoreError,
    UsageRecord,
)
from core.clock import Clock

_PG = {
    "int": "int8",
    "str": "text",
    "float": "float8",
    "bool": "bool",
    "float | None": "float8",
    "str | None": "text",
}
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
# then the replica and each new reservation's model, provider, request id, endpoint and stream flag
_HOLDS = 12 + len(USAGE_PG)
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
    INSERT INTO reservations (group_id, key_id, amount, created_at, replica, model, provider, request_id,
                              endpoint, stream)
    SELECT x.group_id, x.key_id, x.amount, {NOW}, ${_HOLDS}::text, x.model, x.provider, x.request_id,
           x.endpoint, x.stream
    FROM unnest($8::int8[], $9::int8[], $10::int8[], ${_HOLDS + 1}::text[], ${_HOLDS + 2}::text[],
                ${_HOLDS + 3}::text[], ${_HOLDS + 4}::text[], ${_HOLDS + 5}::bool[])
         WITH ORDINALITY AS x(group_id, key_id, amount, model, provider, request_id, endpoint, stream, n)
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
# One batch in one round trip: the function below does what ``lock``, ``LockedBatch`` and ``apply`` do (for a
# batch whose groups have no budget: those still go through ``run_batch``, see ``Budgeted``), on the server, in the transaction of the statement that calls
# it (BATCH): no BEGIN and COMMIT of their own, no rows sent back and forth. ``ops``: a JSON array,
# per operation ``[reserve, group id, key id, amount, reservation id, credits, once, model, provider,
# request id, endpoint, stream]``: a reservation (``reserve``) of ``amount`` with its hold's model,
# provider, request id, endpoint and stream flag, or a settlement of the reservation (holding ``amount``) charging up to ``credits`` (``once``:
# skipped if the reservation is gone). Out, per operation: ``result`` (the new reservation's id, or
# the charge; NULL for a refusal or a skipped settlement) and, for a refusal, its reason and the
# credits available. An operation that cannot run at all raises (SQLSTATE P0001, its message for
# StoreError): the batch is then redone one operation per statement. If a group of the batch has a
# budget (billing/budgets.py), it raises SQLSTATE RB001 once the rows are locked, before it has
# changed anything that stays (the statement is rolled back): the caller runs the batch in Python.
# The operations go as one JSON text rather than a column array each: asyncpg encodes an array
# element by element (an ABC isinstance check each), 268k instructions per call (callgrind).
BATCH_FUNCTION = f"""
CREATE OR REPLACE FUNCTION ledger_batch(ops jsonb, replica text,
                                        OUT result int8[], OUT refusal text[], OUT available int8[])
LANGUAGE plpgsql AS $$
DECLARE
    n int := jsonb_array_length(ops);
    reserve bool[]; gid int8[]; kid int8[]; amount int8[]; rid int8[]; credits int8[]; once bool[];
    model text[]; provider text[]; request text[]; endpoint text[]; stream bool[];
    released int8[];
    g_ids int8[]; g_bal int8[]; g_res int8[]; g_spent int8[];
    k_ids int8[]; k_cap int8[]; k_spent int8[]; k_res int8[];
    gi int; ki int; held int8; charge int8;
BEGIN
    result := array_fill(NULL::int8, ARRAY[n]);
    refusal := array_fill(NULL::text, ARRAY[n]);
    available := array_fill(NULL::int8, ARRAY[n]);
    SELECT array_agg((e->>0)::bool ORDER BY i), array_agg((e->>1)::int8 ORDER BY i),
           array_agg((e->>2)::int8 ORDER BY i), array_agg((e->>3)::int8 ORDER BY i),
           array_agg((e->>4)::int8 ORDER BY i), array_agg((e->>5)::int8 ORDER BY i),
           array_agg((e->>6)::bool ORDER BY i), array_agg(e->>7 ORDER BY i), array_agg(e->>8 ORDER BY i),
           array_agg(e->>9 ORDER BY i), array_agg(e->>10 ORDER BY i), array_agg((e->>11)::bool ORDER BY i)
      INTO reserve, gid, kid, amount, rid, credits, once, model, provider, request, endpoint, stream
      FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(e, i);
    -- the locks in LOCK's order: the reservations settled, the keys, the groups, each in id order
    WITH d AS (
        DELETE FROM reservations WHERE id IN
            (SELECT r.id FROM reservations r WHERE r.id = ANY(rid) ORDER BY r.id FOR UPDATE)
        RETURNING id
    ) SELECT coalesce(array_agg(d.id), '{{}}') INTO released FROM d;
    SELECT coalesce(array_agg(k.id ORDER BY k.id), '{{}}'), array_agg(k.spend_cap ORDER BY k.id),
           array_agg(k.spent ORDER BY k.id), array_agg(k.reserved ORDER BY k.id)
      INTO k_ids, k_cap, k_spent, k_res
      FROM (SELECT x.id, x.spend_cap, x.spent, x.reserved FROM keys x WHERE x.id = ANY(kid)
            ORDER BY x.id FOR NO KEY UPDATE) k;
    SELECT coalesce(array_agg(g.id ORDER BY g.id), '{{}}'), array_agg(g.balance ORDER BY g.id),
           array_agg(g.reserved ORDER BY g.id), array_agg(g.spent ORDER BY g.id)
      INTO g_ids, g_bal, g_res, g_spent
      FROM (SELECT x.id, x.balance, x.reserved, x.spent FROM groups x WHERE x.id = ANY(gid)
            ORDER BY x.id FOR NO KEY UPDATE) g;
    IF EXISTS (SELECT 1 FROM budgets b WHERE b.group_id = ANY(g_ids)) THEN
        RAISE EXCEPTION 'a group of the batch has a budget' USING ERRCODE = 'RB001';
    END IF;
    FOR i IN 1..n LOOP
        gi := array_position(g_ids, gid[i]);
        ki := array_position(k_ids, kid[i]);
        IF reserve[i] THEN
            IF ki IS NOT NULL AND k_cap[ki] IS NOT NULL AND k_spent[ki] + k_res[ki] + amount[i] > k_cap[ki] THEN
                refusal[i] := 'key_cap';
                available[i] := greatest(k_cap[ki] - k_spent[ki] - k_res[ki], 0);
                CONTINUE;
            END IF;
            IF gi IS NULL OR g_bal[gi] < amount[i] THEN
                refusal[i] := 'balance';
                available[i] := coalesce(g_bal[gi], 0);
                CONTINUE;
            END IF;
            IF ki IS NULL THEN
                RAISE EXCEPTION 'no key with id %', kid[i];
            END IF;
            IF amount[i] < 0 THEN
                RAISE EXCEPTION 'a reservation cannot be negative';
            END IF;
            g_bal[gi] := g_bal[gi] - amount[i];
            g_res[gi] := g_res[gi] + amount[i];
            k_res[ki] := k_res[ki] + amount[i];
            INSERT INTO reservations (group_id, key_id, amount, created_at, replica, model, provider, request_id,
                                      endpoint, stream)
            VALUES (gid[i], kid[i], amount[i], {NOW}, replica, model[i], provider[i], request[i], endpoint[i],
                    stream[i])
            RETURNING id INTO held;
            result[i] := held;
        ELSE
            IF gi IS NULL THEN
                RAISE EXCEPTION 'no group with id %', gid[i];
            END IF;
            IF rid[i] = ANY(released) THEN
                held := amount[i];
            ELSIF once[i] AND rid[i] > 0 THEN
                CONTINUE;  -- its reservation is gone: an earlier try of this settlement committed
            ELSE
                held := 0;  -- settled twice, or reconciled
            END IF;
            IF g_res[gi] < held THEN
                RAISE EXCEPTION 'the reservation holds more than its group has reserved';
            END IF;
            released := array_remove(released, rid[i]);
            charge := least(credits[i], g_bal[gi] + held);
            g_res[gi] := g_res[gi] - held;
            g_bal[gi] := g_bal[gi] + held - charge;
            g_spent[gi] := g_spent[gi] + charge;
            IF ki IS NOT NULL THEN
                k_res[ki] := k_res[ki] - held;
                k_spent[ki] := k_spent[ki] + charge;
            END IF;
            result[i] := charge;
        END IF;
    END LOOP;
    UPDATE groups AS g SET balance = d.balance, reserved = d.reserved, spent = d.spent
      FROM unnest(g_ids, g_bal, g_res, g_spent) AS d(id, balance, reserved, spent)
     WHERE g.id = d.id AND (g.balance, g.reserved, g.spent) IS DISTINCT FROM (d.balance, d.reserved, d.spent);
    UPDATE keys AS k SET reserved = d.reserved, spent = d.spent
      FROM unnest(k_ids, k_res, k_spent) AS d(id, reserved, spent)
     WHERE k.id = d.id AND (k.reserved, k.spent) IS DISTINCT FROM (d.reserved, d.spent);
END
$$;
"""
# The usage records of the settlements charged: ``$3`` is a JSON array of ``[operation index (from
# 1), usage record]``; the record's credits are the charge, its time (if it has none) ``$4``.
_SETTLED = ", ".join(
    "b.result[(e.pair->>0)::int]"
    if c == "credits"
    else "coalesce(nullif(x.ts, 0), $4)"
    if c == "ts"
    else f"x.{c}"
    for c in USAGE_COLUMNS
)
BATCH = f"""
WITH b AS MATERIALIZED (
    SELECT * FROM ledger_batch($1::text::jsonb, $2::text)
), u AS (
    INSERT INTO usage ({USAGE_LIST})
    SELECT {_SETTLED}
    FROM b, jsonb_array_elements($3::text::jsonb) WITH ORDINALITY AS e(pair, n),
         LATERAL jsonb_populate_record(NULL::usage, e.pair->1) AS x
    WHERE b.result[(e.pair->>0)::int] IS NOT NULL
    ORDER BY e.n
)
SELECT result, refusal, available FROM b
"""
_json = msgspec.json.Encoder()
STALE = (
    "SELECT id FROM reservations WHERE id > $1 AND ($2::float8 IS NULL OR created_at <= "
    f"{NOW} - $2::float8) ORDER BY id LIMIT $3"
)
TAKE_STALE = (
    "DELETE FROM reservations WHERE id IN "
    "(SELECT id FROM reservations WHERE id = ANY($1::int8[]) ORDER BY id FOR UPDATE SKIP LOCKED) "
    "RETURNING id, group_id, key_id, amount, model, provider, request_id, progress, progress_tokens, progress_at, "
    "progress_text, endpoint, stream"
)
INTERRUPTED = "reservation left by a stopped process, released on restart"
CUT = "reservation whose commit was cut off with the connection (its call was refused or reserved again), released"
APPLIED = f"INSERT INTO journal_applied (id, ts) SELECT unnest($1::text[]), {NOW} ON CONFLICT (id) DO NOTHING RETURNING id"
BUDGET_HINT = 30.0  # seconds a group found with a budget is batched in Python without trying ledger_batch
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


Op = ReserveOp | SettleOp


@dataclass(slots=True)
class Row:
    """A locked group (balance, reserved, spent) or key (spend_cap in ``cap``, spent, reserved) row."""

    balance: int = 0
    reserved: int = 0
    spent: int = 0
    cap: int | None = None


@dataclass(slots=True)
class LockedBatch:
    """What a batch does to the rows it has locked: each operation in turn, as the SQLite store would
    do it; the net changes are then written at once."""

    released: set[int]  # reservations this batch deleted, not yet claimed by a settlement
    keys: dict[int, Row]
    groups: dict[int, Row]
    now: float = field(default_factory=time.time)
    start: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    reservations: list[tuple[int, int, int]] = field(default_factory=list)
    holds: list[tuple[str | None, str | None, str | None, str | None, bool | None]] = field(
        default_factory=list
    )
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
        key, group = self.keys.get(key_id), self.groups.get(group_id)
        if group is None:
            return Refusal("balance", 0, amount)
        if key is None:
            raise StoreError(f"no key with id {key_id}")
        if amount < 0:
            raise StoreError("a reservation cannot be negative")
        key_room = key.cap - key.spent - key.reserved if key.cap is not None else None
        # the key's and group's budgets (billing/budgets.py), their rows locked above
        over = (
            partial(self.windows.check, group_id, key_id, group.reserved, key.reserved, amount)
            if self.windows
            else None
        )
        refused = rules.refusal(amount, key_room, over, group.balance)
        if refused is not None:
            return refused
        group.balance -= amount
        group.reserved += amount
        key.reserved += amount
        self.reservations.append((group_id, key_id, amount))
        self.holds.append(
            (hold.model, hold.provider, hold.request_id, hold.endpoint, hold.stream)
            if hold
            else (None, None, None, None, None)
        )
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
        charge = rules.charge(record.credits, group.balance, held)
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
        groups = [
            (gid, r.balance - b, r.reserved - res, r.spent - s)
            for gid, r in self.groups.items()
            for b, res, s in [self.start["g", gid]]
        ]
        keys = [
            (kid, r.reserved - res, r.spent - s)
            for kid, r in self.keys.items()
            for _, res, s in [self.start["k", kid]]
        ]
        groups = [g for g in groups if any(g[1:])]
        keys = [k for k in keys if any(k[1:])]
        return [
            *columns(groups, 4),
            *columns(keys, 3),
            *columns(self.reservations, 3),
            len(groups),
            *columns(self.usage, len(USAGE_COLUMNS)),
            replica,
            *columns(self.holds, 5),
        ]


def columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


class Budgeted(Exception):
    """A group of the batch has a budget: ``ledger_batch`` leaves such batches to ``run_batch``."""


async def run_fast(conn: asyncpg.Connection, ops: Sequence[Op], replica: str | None = None) -> list[Any]:
    """One statement (one transaction, one round trip) for ``ops``: ``ledger_batch`` runs them on the
    server. Returns each operation's result; raises if any fails (``Budgeted`` if a group of the
    batch has a budget: then nothing was done)."""
    try:
        row = await conn.fetchrow(BATCH, *batch_args(ops, replica))
    except asyncpg.RaiseError as exc:  # an operation that cannot run (ledger_batch's RAISE)
        raise StoreError(exc.message) from None
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == "RB001":
            raise Budgeted() from None
        raise
    assert row is not None
    results: list[Any] = []
    for op, value, reason, left in zip(ops, row[0], row[1], row[2], strict=True):
        if isinstance(op, SettleOp):
            results.append(value)
        elif reason is not None:
            results.append(Refusal(reason, left, op.amount))
        else:
            results.append(Reservation(value, op.group_id, op.key_id, op.amount))
    return results


def batch_args(ops: Sequence[Op], replica: str | None) -> tuple[str, str | None, str, float]:
    """The parameters of ``BATCH``: the operations, the replica, the usage records of the settlements
    and the time of those that have none."""
    rows: list[tuple[Any, ...]] = []
    usage: list[tuple[int, UsageRecord]] = []
    for n, op in enumerate(ops, start=1):
        if isinstance(op, ReserveOp):
            hold = op.hold
            if hold is None:
                rows.append((True, op.group_id, op.key_id, op.amount, 0, 0, False))
            else:
                rows.append(
                    (
                        True,
                        op.group_id,
                        op.key_id,
                        op.amount,
                        0,
                        0,
                        False,
                        hold.model,
                        hold.provider,
                        hold.request_id,
                        hold.endpoint,
                        hold.stream,
                    )
                )
        else:
            r = op.reservation
            rows.append((False, r.group_id, r.key_id, r.amount, r.id, op.record.credits, op.once))
            usage.append((n, op.record))
    return _json.encode(rows).decode(), replica, _json.encode(usage).decode(), time.time()


async def run_batch(
    conn: asyncpg.Connection, ops: Sequence[Op], replica: str | None = None, now: float | None = None
) -> list[Any]:
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
    return [
        Reservation(new_ids[r], *plan.reservations[r])
        if isinstance(op, ReserveOp) and isinstance(r, int)
        else r
        for op, r in zip(ops, results, strict=True)
    ]


async def lock(
    conn: asyncpg.Connection,
    settled: list[int],
    key_ids: list[int],
    group_ids: list[int],
) -> LockedBatch:
    """Take the reservations being settled, lock the keys, then the groups, and read them."""
    plan = LockedBatch(set(), {}, {})
    for kind, rid, a, b, c in await conn.fetch(LOCK, settled, key_ids, group_ids):
        if kind == "r":
            plan.released.add(rid)
        elif kind == "k":
            plan.keys[rid] = Row(cap=a, spent=b, reserved=c)
        else:
            plan.groups[rid] = Row(balance=a, reserved=b, spent=c)
    plan.remember()
    return plan


async def apply(conn: asyncpg.Connection, plan: LockedBatch, replica: str | None = None) -> list[int]:
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


# -- group commit -------------------------------------------------------------------------------------
class LedgerCommits:
    """Many ledger operations, one transaction: operations queue up while a batch commits, then the
    next batch takes them all; every caller awaits its own operation's commit."""

    linger = 0.02  # as the SQLite store's group commit (billing/sqlite.py GroupCommit)

    def __init__(
        self, db: PostgresPool, limit: int = 1024, owner: Store | None = None, clock: Clock = time.time
    ) -> None:
        self.db = db
        self.owner = owner  # the store whose ``rescue`` is offered the settlements that fail
        self.clock = clock  # the budget windows' (core/clock.py)
        # groups found with a budget (when, monotonic): their batches go to run_batch for BUDGET_HINT s
        self.budgeted: dict[int, float] = {}
        self.limit = limit
        self.pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.conn: asyncpg.Connection | None = None  # the batches' own, kept from one batch to the next
        self.pid = 0  # its backend's
        self.batches = 0
        # this process's name on the reservations it makes (billing/leases.py)
        self.replica: str | None = None
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
            self.pid = self.conn.get_server_pid()
        return self.conn

    def _fail(self, batch: list[tuple[Op, asyncio.Future[Any]]], exc: BaseException) -> None:
        """Fail these operations, offering each first try of a settlement to ``Store.rescue``."""
        rescue = self.owner.rescue if self.owner is not None else None
        if rescue is not None and not isinstance(exc, asyncio.CancelledError):
            batch = [
                (op, future)
                for op, future in batch
                if not (
                    isinstance(op, SettleOp)
                    and not op.once
                    and not future.done()
                    and rescue(op.reservation, op.record, self.began, future, exc)
                )
            ]
        fail(batch, exc)

    async def _sweep(self, conn: asyncpg.Connection) -> None:
        """Release the holds of this replica that none of its calls knows (see ``suspect``)."""
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
                batch, self.pending = self.pending[: self.limit], self.pending[self.limit :]
                await self._commit(batch)
        except BaseException as exc:  # no connection (or cancelled): the queued callers get the error
            batch, self.pending = self.pending, []
            self._fail(batch, lost(exc) if down(exc) else exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.task = None

    async def _commit(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        """``batch`` in one transaction on the kept connection (after the sweep, if one is due). A
        connection lost meanwhile (the server killed it, or restarted) is replaced and the batch tried
        again on the new one, at most ``max_size`` times, as the pool's statements. Refused by asyncpg
        before any of it was sent (``refused``), nothing of it ran. Cut off after it was sent, it may have
        committed: the lost connection's backend is first ended (if the server has not ended it yet) and
        waited for, so its transaction has committed or rolled back for good; then its
        reservations, if they committed, are holds of this replica that no call of it knows, released by
        the sweep (``CUT``: an ``interrupted`` record each, no charge), and its settlements go as retries
        (``once``: skipped if their reservation is gone, their charge made). A reservation without a
        replica name (a store not serving) cannot be told from a committed one: its caller gets the
        error, as do all of them if the batch fails again (a settlement then goes to ``Store.rescue``)."""
        ops = [op for op, _ in batch]
        cut: int | None = None  # the backend of the connection cut off mid-batch: ended before the next try
        for tries_left in range(self.db.max_size, -1, -1):
            try:
                conn = await self._connection()
                if cut is not None and not await ended(conn, cut):
                    raise asyncpg.InterfaceError("the backend of a lost connection did not end")
                if self.suspect:
                    await self._sweep(conn)
                results = await self._attempt(conn, ops)
            except Exception as exc:
                sent = not refused(exc, self.conn)
                if not down(exc) or not tries_left:
                    await self._failed(batch, exc)
                    return
                if sent:
                    cut = self.pid
                    if self.replica is None:  # (no sweep can find its reservations)
                        self._fail([(op, f) for op, f in batch if isinstance(op, ReserveOp)], lost(exc))
                        batch = [(op, f) for op, f in batch if not isinstance(op, ReserveOp)]
                        if not batch:
                            await self._drop()
                            return
                    ops = [replace(op, once=True) if isinstance(op, SettleOp) else op for op, _ in batch]
                    self.suspect = self.suspect or any(isinstance(op, ReserveOp) for op in ops)
                await self._drop()
                continue
            except BaseException as exc:
                await self._failed(batch, exc)
                raise
            self._done(batch, results)
            return

    async def _failed(self, batch: list[tuple[Op, asyncio.Future[Any]]], exc: BaseException) -> None:
        """Nothing committed (or, if the connection went during COMMIT, unknown: a settlement's retry finds
        out, billing/durable.py): every caller gets the error."""
        if not down(exc):
            self._fail(batch, exc)
            return
        self.suspect = self.suspect or (
            self.replica is not None and any(isinstance(op, ReserveOp) for op, _ in batch)
        )
        try:
            await self._drop()
        finally:
            self._fail(batch, lost(exc))

    def _done(self, batch: list[tuple[Op, asyncio.Future[Any]]], results: list[tuple[bool, Any]]) -> None:
        self.batches += 1
        live = self.live
        for (op, future), (ok, value) in zip(batch, results, strict=True):
            if ok and isinstance(op, SettleOp):
                live.discard(op.reservation.id)
                if value is None:  # a retry that an earlier try had applied: its charge
                    value = op.record.credits
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

    async def _run(self, conn: asyncpg.Connection, ops: list[Op]) -> list[Any]:
        """In one statement (``run_fast``) unless a group of the batch had a budget lately; then, or
        if ``ledger_batch`` finds one, in Python with the budgets' windows (``run_batch``)."""
        groups = {op.group_id if isinstance(op, ReserveOp) else op.reservation.group_id for op in ops}
        now = time.monotonic()
        if not any(self.budgeted.get(g, -BUDGET_HINT) > now - BUDGET_HINT for g in groups):
            try:
                return await run_fast(conn, ops, self.replica)
            except Budgeted:
                self.budgeted.update(dict.fromkeys(groups, now))
        return await run_batch(conn, ops, self.replica, self.clock())

    async def _retrying(self, conn: asyncpg.Connection, ops: list[Op]) -> list[Any]:
        for attempt in range(1, RETRIES + 1):
            try:
                return await self._run(conn, ops)
            except asyncpg.DeadlockDetectedError:
                if attempt == RETRIES:
                    raise
        raise AssertionError("unreachable")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def ended(conn: asyncpg.Connection, pid: int, wait: float = 2.0) -> bool:
    """Whether the backend ``pid`` (of a connection lost mid-statement) is gone, ended from ``conn`` if it
    still runs (the server may not have noticed the loss): then its transaction will never commit."""
    await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1", pid)
    deadline = time.monotonic() + wait
    while await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def refused(exc: BaseException, conn: asyncpg.Connection | None) -> bool:
    """``unsent``, for a connection that may be gone (then not known: False)."""
    try:
        return conn is not None and unsent(exc, conn)
    except asyncpg.InterfaceError:
        return False


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


CHARGED = "charged for what its stream had generated at its last checkpoint"


def _charged(cut: list[tuple[str, int, float | None, str]]) -> list[UsageRecord]:
    return [charged(*row) for row in cut]


def released_mark(reservation_id: int) -> str:
    """How the record of a released hold begins: a journaled settlement of that hold replayed later
    (billing/postgres.py ``replay``) knows from it that the hold was released, not settled."""
    return f"hold {reservation_id}: "


async def release(conn: asyncpg.Connection, ids: list[int], why: str) -> int:
    """Release these reservations with an ``interrupted`` record each, unless another replica holds or
    has released them already: the usage its stream had at its last checkpoint, and its charge
    (billing/progress.py); else its hold's model, provider and request id, and no charge."""
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT DISTINCT group_id, key_id FROM reservations WHERE id = ANY($1::int8[])", ids
        )
        plan = await lock(conn, [], sorted({r[1] for r in rows}), sorted({r[0] for r in rows}))
        taken = await conn.fetch(TAKE_STALE, ids)  # rows another replica has locked are skipped
        # (a text an earlier replica kept, counted on a worker thread)
        cut = [(row[7], row[8] or 0, row[9], row[10] or "") for row in taken if row[7]]
        charges = iter(await asyncio.get_running_loop().run_in_executor(None, _charged, cut) if cut else ())
        for (
            rid,
            group_id,
            key_id,
            amount,
            model,
            provider,
            request_id,
            progress,
            *_,
            endpoint,
            stream,
        ) in taken:
            plan.released.add(rid)
            if progress:  # what the stream had generated at its last checkpoint
                record = replace(next(charges), error=f"{released_mark(rid)}{why}; {CHARGED}")
            else:
                record = UsageRecord(
                    key_id=key_id,
                    group_id=group_id,
                    model=model or "",
                    provider=provider or "",
                    endpoint=endpoint or "chat",
                    stream=bool(stream),
                    status="interrupted",
                    usage_exact=False,
                    request_id=request_id,
                    error=f"{released_mark(rid)}{why}",
                    error_code="interrupted",
                )
            plan.settle(Reservation(rid, group_id, key_id, amount), record)
        await apply(conn, plan)
    return len(taken)
