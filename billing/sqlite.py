"""SQLite store: the embedded default. One connection, owned by one worker thread, in WAL mode
(:class:`billing.sqlite_thread.SQLiteThread`, shared with the jobs store and the console), and the
group commits of the ledger on a second connection of the event loop's own.

Every other operation runs on that thread (never on the event loop); the schema is versioned and
migrated on open. Several processes may share the file (the CLI beside a running gateway): WAL and a busy
timeout make that safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from billing import budgets, end_users, rollup, rules
from billing.history import History
from billing.journal import Entry
from billing.owed import OwedLog, entry_id
from billing.progress import charged
from billing.records import USAGE_COLUMNS, USAGE_TYPES
from billing.schema import LEDGER, ddl
from billing.sqlite_thread import SQLiteThread, down, savepoint, transaction
from billing.store import (
    Checkpoint,
    Principal,
    Reservation,
    Store,
    StoreDown,
    StoreError,
    UsageRecord,
    principal_by_hash_query,
    principal_row,
)
from core.catalog import NANO

if TYPE_CHECKING:
    from core.config import StoreSettings

T = TypeVar("T")

# Python's sqlite3 binds int, float and str as they are, but "adapts" every other parameter, None
# included: it looks for a registered adapter, then asks the PrepareProtocol type and the value for
# __adapt__ / __conform__, each miss raising and clearing an AttributeError (about 250 ns a None, and a
# usage row has a dozen). With an adapter registered for None the registry answers at once; {}.get is
# a C function that returns None for None. Process-wide, and the identity: no other behaviour changes.
sqlite3.register_adapter(type(None), cast(Callable[[None], None], {}.get))
log = logging.getLogger("router.store")
_PRINCIPAL_BY_HASH = principal_by_hash_query("?", "?")

MIGRATIONS: list[str] = [
    # 1: groups and keys; 2: the ledger: reservations in flight and one usage record per call (billing/schema.py)
    *ddl("sqlite", *LEDGER),
    # 3: the usage history's filters as index ranges (billing/history.py); the console used to add
    # them on first use, under other names
    """
    DROP INDEX IF EXISTS console_usage_group_source;
    DROP INDEX IF EXISTS console_usage_group_model;
    DROP INDEX IF EXISTS console_usage_key;
    CREATE INDEX usage_group_source ON usage(group_id, source, id);
    CREATE INDEX usage_group_model ON usage(group_id, model, id);
    CREATE INDEX usage_key ON usage(key_id, id);
    """,
    # 4: the deployment that served each call (a provider's several accounts: core/deployments.py)
    """
    ALTER TABLE usage ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
    CREATE INDEX usage_group_deployment ON usage(group_id, deployment, id);
    """,
    # 5: the error's code, the batch of a job's line and the caller's end user (the request's
    # ``user``) on each record; the history's filters on them, and on status, as index ranges
    """
    ALTER TABLE usage ADD COLUMN error_code TEXT;
    ALTER TABLE usage ADD COLUMN batch_id TEXT;
    ALTER TABLE usage ADD COLUMN end_user TEXT;
    CREATE INDEX usage_group_status ON usage(group_id, status, id);
    CREATE INDEX usage_batch ON usage(batch_id, id) WHERE batch_id IS NOT NULL;
    CREATE INDEX usage_group_user ON usage(group_id, end_user, id) WHERE end_user IS NOT NULL;
    CREATE INDEX usage_request ON usage(request_id);
    """,
    # 6: the rollups of the usage records, for aggregates over long periods (billing/rollup.py)
    rollup.migration(sqlite=True),
    # 7: the rollups keep the deployment too (rebuilt from the usage table at the next refresh)
    rollup.rebuild(sqlite=True),
    # 8: the journaled settlements applied (billing/journal.py): each is applied at most once
    """
    CREATE TABLE journal_applied (id TEXT PRIMARY KEY, ts REAL NOT NULL) WITHOUT ROWID;
    """,
    # 9: key lifecycle: expiry, tags, owner, last used (batched), the secret a rotation replaced
    """
    ALTER TABLE keys ADD COLUMN expires_at REAL;
    ALTER TABLE keys ADD COLUMN tags TEXT;
    ALTER TABLE keys ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE keys ADD COLUMN last_used_at REAL;
    ALTER TABLE keys ADD COLUMN prev_hash TEXT;
    ALTER TABLE keys ADD COLUMN prev_until REAL;
    CREATE UNIQUE INDEX keys_prev_hash ON keys(prev_hash) WHERE prev_hash IS NOT NULL;
    """,
    # 10: the usage so far of streams in flight (billing/progress.py): charged at the next start if the
    # process died before it settled them (their reservation's id in that process, their record)
    """
    CREATE TABLE in_progress (reservation INTEGER PRIMARY KEY, request_id TEXT, record TEXT NOT NULL);
    """,
    # 11: the lines of the owed log (billing/owed.py) each group commit applied, as ranges of its seqs
    """
    CREATE TABLE owed_applied (epoch TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL);
    CREATE INDEX owed_applied_hi ON owed_applied(epoch, hi);
    """,
    # 12: each batch's totals kept up to the rollups' watermark (billing/analysis.py, Analysis.batches)
    rollup.BATCH_TOTALS,
    # 13: the attempts of a call that tried more than one deployment, or one more than once
    "ALTER TABLE usage ADD COLUMN attempts TEXT;",
    # 14: the text a stream generated, a row per checkpoint (its tokens counted only if it is cut:
    # billing/progress.py): from which character of it, and when. Rows are appended (a tick's rows land
    # on the table's last pages, however many streams are in flight and however long they have run)
    """
    CREATE TABLE in_progress_text (reservation INTEGER NOT NULL, start INTEGER NOT NULL, text TEXT NOT NULL,
                                   at REAL NOT NULL);
    CREATE INDEX in_progress_text_reservation ON in_progress_text(reservation);
    """,
    # 15: a stream's checkpoints keep the tokens it generated, counted, and when the last was; no text
    # (``in_progress_text`` holds only what a process before this one kept: charged at the next start)
    """
    ALTER TABLE in_progress ADD COLUMN completion INTEGER;
    ALTER TABLE in_progress ADD COLUMN at REAL;
    """,
]

# A batch's records go in by statements of a power of two rows, at most _ROWS_PER_INSERT (within SQLite's
# default limit of 32,766 bound parameters): sqlite3 keeps every statement it compiled (up to 128 per
# connection), about 2 KiB a row, so one statement per batch size kept up to 128 x 2.4 MB compiled
# (measured: SQLite's memory 3 -> 12 MB over 12 bursts of 1,000 streams); 9 sizes keep about 1 MB a form.
_ROWS_PER_INSERT = 256
# Columns most records leave None: an insert whose records all do leaves them out (their default is
# NULL), each None bound costing sqlite3 an adaptation (see the None adapter). Two forms of the
# statement, not one per subset, to keep few in sqlite3's statement cache.
_RARE = ("error", "error_code", "batch_id", "end_user", "safety_identifier", "metadata", "attempts")
_LEAN = tuple(c for c in USAGE_COLUMNS if c not in _RARE)
_NO_RARE = (None,) * len(_RARE)
_rare_of = attrgetter(*_RARE)
_lean_of = attrgetter(*_LEAN)
_full_of = attrgetter(*_LEAN, *_RARE)
_TS = _LEAN.index("ts")
_CREDITS = _LEAN.index("credits")
# the bool fields, stored as 0 / 1: bound as ints, which sqlite3 binds as they are (a bool it adapts)
_BOOLS = tuple(_LEAN.index(n) for n, kind in USAGE_TYPES.items() if kind == "bool")


@lru_cache(maxsize=64)
def _insert_sql(rows: int, lean: bool) -> str:
    columns = _LEAN if lean else (*_LEAN, *_RARE)
    marks = f"({', '.join('?' * len(columns))})"
    return f"INSERT INTO usage ({', '.join(columns)}) VALUES {', '.join([marks] * rows)}"


def _usage_insert(
    records: Sequence[UsageRecord], charges: Sequence[int], stamp: float
) -> tuple[str, list[Any]]:
    """The statement and parameters that insert ``records``, charged ``charges``, into ``usage``,
    stamped ``stamp`` if they have no time yet: the values :func:`billing.store.usage_values` gives,
    bools as 0 / 1, and the :data:`_RARE` columns left out if every record has them None."""
    lean = all(_rare_of(record) == _NO_RARE for record in records)
    values_of = _lean_of if lean else _full_of
    width = len(_LEAN) if lean else len(USAGE_COLUMNS)
    params: list[Any] = []
    for at, record, charge in zip(range(0, width * len(records), width), records, charges, strict=True):
        params += values_of(record)
        params[at + _CREDITS] = charge
        if not params[at + _TS]:
            params[at + _TS] = stamp
        for i in _BOOLS:
            params[at + i] = 1 if params[at + i] else 0
    return _insert_sql(len(records), lean), params


class GroupCommit:
    """Many small writes, one transaction: operations queue up for ``linger`` seconds (and while a
    batch is being written), then run together in one transaction, each in its own savepoint so one
    failure does not undo the others; every caller may await its own operation's commit.

    A batch runs on the event loop's own connection (:meth:`SQLiteStore.commit_here`): on the
    store's thread, every statement would let go of the GIL and then have to win it back from the
    busy event loop, a context switch each time (measured: 0.9 switches per call, 15 % of the
    gateway's CPU). It never waits there: if another connection holds the write lock (the CLI, the
    console), or the database is in memory, the batch goes to the store's thread, which waits.
    In WAL mode with ``synchronous=NORMAL`` a commit writes the log without an fsync; the checkpoint
    (which does fsync) runs on the thread. The linger keeps batches large: calls do not wait for
    their settlement (billing/ledger.py), so it costs them no latency; 20 ms rather than 5 halves the
    store's share of a call's CPU at 2,000 calls/s (fewer, larger transactions). Once it has
    lingered, a batch waits up to ``quiet_wait`` more for a call to go to its upstream (:meth:`quiet`)
    and is written then; linger and wait are the window a hard kill can lose (30 ms at most).
    """

    linger = 0.02
    quiet_wait = 0.01  # after the linger: how long a batch may wait for a quiet moment (upstream_wait)

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self.draining = False
        self.batches = 0
        self.task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[bool | None] | None = None  # True: somebody waits for the batch
        self._quiet: asyncio.Future[bool | None] | None = None  # while a batch waits for a quiet moment

    def submit(self, op: Callable[[sqlite3.Connection], T], linger: bool = False) -> asyncio.Future[T]:
        """Queue ``op`` for the next batch. ``linger``: nobody waits for it, so the batch may wait
        ``linger`` seconds for more; an op that somebody awaits starts the batch at once."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.pending.append((op, future))
        if not self.draining:
            self.draining = True
            self.task = loop.create_task(self._drain(self.linger if linger else 0.0))
        elif not linger and self._wake is not None and not self._wake.done():
            self._wake.set_result(True)  # a waiting caller: stop lingering (or waiting for a quiet moment)
        return future

    def quiet(self) -> None:
        """:meth:`SQLiteStore.upstream_wait`: a call is about to wait for its upstream. A batch that
        has lingered is written once that call's request has gone out (``call_soon``: after the
        task step that sends it), while the loop would otherwise wait: with an upstream that answers
        in a fraction of a millisecond (the benchmark's emulator, one client), a batch written at
        the linger's end lands on a call's work about half the time and delays it by its whole
        length (0.3 ms, 1.2 ms at the 99th percentile, measured)."""
        waiting = self._quiet
        if waiting is not None and not waiting.done():
            self._quiet = None
            asyncio.get_running_loop().call_soon(_resolve, waiting)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        while self.task is not None and not self.task.done():
            await asyncio.shield(self.task)

    async def _drain(self, linger: float) -> None:
        try:
            if linger:
                loop = asyncio.get_running_loop()
                self._wake = wake = loop.create_future()
                timer = loop.call_later(linger, _resolve, wake)
                urgent = await wake
                timer.cancel()
                if not urgent:  # the linger ran out: the batch waits for a quiet moment (see quiet)
                    self._quiet = quiet = self._wake = loop.create_future()
                    timer = loop.call_later(self.quiet_wait, _resolve, quiet)
                    await quiet
                    timer.cancel()
                    self._quiet = None
                self._wake = None
            while self.pending:
                batch, self.pending = self.pending, []
                began = time.monotonic()
                try:
                    ops = [op for op, _ in batch]
                    here = self.store.commit_here(ops)
                    results = (
                        here if here is not None else await self.store.run(partial(self._apply, ops=ops))
                    )
                except BaseException as exc:  # the whole transaction failed
                    results = [(False, exc)] * len(batch)
                self.batches += 1
                rescue = self.store.rescue
                for (op, future), (ok, value) in zip(batch, results, strict=True):
                    if not future.done():
                        if ok:
                            future.set_result(value)
                        elif not (
                            rescue is not None
                            and isinstance(op, Settle)
                            and not op.again
                            and rescue(
                                op.reservation, op.record, began, future, value, self.store.owed_retry(op)
                            )
                        ):
                            future.set_exception(value)
        finally:
            self.draining = False

    @staticmethod
    def _apply(
        db: sqlite3.Connection, ops: list[Callable[[sqlite3.Connection], Any]], begun: bool = False
    ) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        with transaction(db, begun):
            for settles, group in groupby(ops, key=lambda op: isinstance(op, Settle)):
                run = list(group)
                if settles and len(run) > 1 and _settle_together(db, cast(list[Settle], run), results):
                    continue  # a run of settlements, applied together
                for op in run:
                    try:
                        with savepoint(db):
                            results.append((True, op(db)))
                    except Exception as exc:
                        results.append((False, exc))
            _owed_applied(db, ops, results)
        return results


class Settle:
    """A settlement queued for the group commit: one call's charge and usage record. A run of them in
    one batch is applied together by :func:`_settle_together`."""

    __slots__ = ("reservation", "record", "again", "now", "noted", "epoch", "owed")

    def __init__(
        self,
        reservation: Reservation,
        record: UsageRecord,
        now: float,
        again: bool = False,
        noted: bool = False,
        epoch: str = "",
        owed: int = 0,
    ) -> None:
        self.reservation = reservation
        self.record = record
        self.again = again  # a retry (Store.settle_again): never offered to Store.rescue
        self.now = now  # the store's clock when it was queued: the budget buckets it falls in
        # its stream's progress was kept (SQLiteStore.note_progress): that row goes with it
        self.noted = noted
        self.epoch, self.owed = epoch, owed  # its line in the owed log (billing/owed.py), if it has one

    def __call__(self, db: sqlite3.Connection) -> int:
        _forget_progress(db, (self,))
        return settle_rows(db, [(self.reservation, self.record)], self.now)[0]


def _forget_progress(db: sqlite3.Connection, settles: Sequence[Settle]) -> None:
    """The progress rows of the streams these settle (in the settlement's transaction)."""
    noted = [(s.reservation.id,) for s in settles if s.noted]
    if noted:
        db.executemany("DELETE FROM in_progress WHERE reservation = ?", noted)


@lru_cache(maxsize=16)
def _balances_sql(groups: int) -> str:
    """The balances of ``groups`` groups, and whether each has a budget (its own or a key's): in the
    settlement's own transaction, so a budget another process just added is seen."""
    return (
        "SELECT id, balance, EXISTS (SELECT 1 FROM budgets WHERE budgets.group_id = groups.id) FROM groups "
        f"WHERE id IN ({', '.join('?' * groups)})"
    )


def settle_rows(
    db: sqlite3.Connection, settles: list[tuple[Reservation, UsageRecord]], now: float | None = None
) -> list[int]:
    """Charge each call, in order, what its record says, capped by what its group has left (its
    stored reservation, if any, released first), and add it to the current bucket (at ``now``, the
    store's clock) of its key's and group's budgets (billing/budgets.py); write the usage records;
    return the charges. One
    balance read per group, one update per group and per key, one multi-row insert: few statements,
    as each one lets go of the GIL and must win it back from the event loop."""
    held_of: list[int] = []
    for r, _ in settles:
        held = 0  # a reservation held in the gateway's memory (negative id) has no row here
        if r.id > 0 and db.execute("DELETE FROM reservations WHERE id = ?", (r.id,)).rowcount:
            held = r.amount  # (no row: settled twice, or reconciled already)
        held_of.append(held)
    group_ids = sorted({r.group_id for r, _ in settles})
    found = db.execute(_balances_sql(len(group_ids)), group_ids).fetchall()
    balance = {group_id: left for group_id, left, _ in found}
    groups: dict[int, list[int]] = {}  # id -> [held, charged]
    keys: dict[int, list[int]] = {}
    charges: list[int] = []
    budgeted = [group_id for group_id, _, has in found if has]  # (most groups have none: no read)
    windows = budgets.read_sync(db, budgeted, time.time() if now is None else now)
    for (r, record), held in zip(settles, held_of, strict=True):
        charge = rules.charge(record.credits, balance[r.group_id], held) if record.credits > 0 else 0
        if r.group_id in balance:
            balance[r.group_id] += held - charge
        for total in (groups.setdefault(r.group_id, [0, 0]), keys.setdefault(r.key_id, [0, 0])):
            total[0] += held
            total[1] += charge
        charges.append(charge)
        if windows:
            windows.charge(r.group_id, r.key_id, charge)
    budgets.write_sync(db, windows)
    stamp = time.time()
    records = [record for _, record in settles]
    at = 0
    while at < len(records):
        rows = min(_ROWS_PER_INSERT, 1 << ((len(records) - at).bit_length() - 1))
        db.execute(*_usage_insert(records[at : at + rows], charges[at : at + rows], stamp))
        at += rows
    for g, (h, c) in groups.items():
        if h or c:
            db.execute(
                "UPDATE groups SET reserved = reserved - ?, balance = balance + ? - ?, spent = spent + ? WHERE id = ?",
                (h, h, c, c, g),
            )
    for k, (h, c) in keys.items():
        if h or c:
            db.execute("UPDATE keys SET reserved = reserved - ?, spent = spent + ? WHERE id = ?", (h, c, k))
    return charges


def _settle_together(db: sqlite3.Connection, settles: list[Settle], results: list[tuple[bool, Any]]) -> bool:
    """Apply ``settles`` in one savepoint with the same outcome as one by one, in order; False (and
    nothing changed) if any of them fails, so the caller runs them one by one instead."""
    try:
        with savepoint(db, "settles"):
            _forget_progress(db, settles)
            charges = settle_rows(db, [(s.reservation, s.record) for s in settles], settles[-1].now)
    except Exception:
        return False
    results.extend((True, charge) for charge in charges)
    return True


def replay_rows(db: sqlite3.Connection, entries: Sequence[Entry]) -> dict[str, bool]:
    """Store.replay on SQLite: one transaction; an entry whose id is in ``journal_applied`` is skipped."""
    done: dict[str, bool] = {}
    now = time.time()
    with transaction(db):
        for entry in entries:
            if not db.execute(
                "INSERT OR IGNORE INTO journal_applied (id, ts) VALUES (?, ?)", (entry.id, now)
            ).rowcount:
                done[entry.id] = False  # applied by an earlier replay
                continue
            try:
                with savepoint(db, "entry"):
                    if entry.reservation.id < 0:  # (a stream's progress kept, then its settlement journaled)
                        db.execute(
                            "DELETE FROM in_progress WHERE reservation = ? AND request_id IS ?",
                            (entry.reservation.id, entry.record.request_id),
                        )
                    settle_rows(db, [(entry.reservation, entry.record)])
                done[entry.id] = True
            except Exception as exc:
                if isinstance(exc, sqlite3.Error) and down(exc):
                    raise
                log.error("a journaled settlement was refused (%r): %r", exc, entry.record)
                done[entry.id] = False
    return done


def _owed_applied(
    db: sqlite3.Connection, ops: list[Callable[[sqlite3.Connection], Any]], results: list[tuple[bool, Any]]
) -> None:
    """In a group commit's transaction: the owed log's lines it applied, as ranges of their seqs (one row
    per epoch grows while the ranges follow each other: one statement per commit)."""
    ranges: list[list[Any]] = []
    for op, (ok, _) in zip(ops, results, strict=True):
        if ok and type(op) is Settle and op.owed:
            if ranges and ranges[-1][0] == op.epoch and ranges[-1][2] == op.owed - 1:
                ranges[-1][2] = op.owed
            else:
                ranges.append([op.epoch, op.owed, op.owed])
    for epoch, lo, hi in ranges:
        if not db.execute(
            "UPDATE owed_applied SET hi = ? WHERE epoch = ? AND hi = ?", (hi, epoch, lo - 1)
        ).rowcount:
            db.execute("INSERT INTO owed_applied (epoch, lo, hi) VALUES (?, ?, ?)", (epoch, lo, hi))


def _note_progress(db: sqlite3.Connection, rows: list[Checkpoint]) -> None:
    charged = [
        (row.reservation, row.request_id, row.charge, row.completion, row.at)
        for row in rows
        if row.charge is not None
    ]
    if charged:
        db.executemany(NOTE_CHARGE, charged)
    if len(charged) < len(rows):
        db.executemany(
            NOTE_COUNT, [(row.completion, row.at, row.reservation) for row in rows if row.charge is None]
        )


# a stream's checkpoint, a row of its own: with its charge when that changed (or was never written),
# else its count and time only (a write made again after one that seemed to fail writes the same)
NOTE_CHARGE = "INSERT OR REPLACE INTO in_progress (reservation, request_id, record, completion, at) VALUES (?, ?, ?, ?, ?)"
NOTE_COUNT = "UPDATE in_progress SET completion = ?, at = ? WHERE reservation = ?"


def _text_of(db: sqlite3.Connection, reservation: int) -> tuple[str, float | None]:
    """The text kept of a stream by a process before checkpoints kept counts (``in_progress_text``),
    each character once, and when its last checkpoint was."""
    parts, end, last = [], 0, None
    for start, text, at in db.execute(
        "SELECT start, text, at FROM in_progress_text WHERE reservation = ? ORDER BY start, rowid",
        (reservation,),
    ):
        if start + len(text) > end:
            parts.append(text[max(0, end - start) :])
            end = start + len(text)
        last = at if last is None else max(last, at)
    return "".join(parts), last


def _cut_stream(
    db: sqlite3.Connection, reservation: int, charge: str, completion: int | None, at: float | None
) -> UsageRecord:
    """The record of a stream a stopped process left in progress (its text, if that process kept one)."""
    if completion is None:
        text, at = _text_of(db, reservation)
        return charged(charge, 0, at, text)
    return charged(charge, completion, at)


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


CHECKPOINT_EVERY = 1.0  # seconds between WAL checkpoints after group commits (on the store's thread)


def _checkpoint(db: sqlite3.Connection) -> Any:
    return db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


def sqlite_path(url: str) -> str:
    rest = url[len("sqlite://") :]
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise StoreError(f"store URL {url!r} names no file")
    return rest


class SQLiteStore(Store):
    exclusive = True  # one gateway process per file (lock_owner): admission is held in its memory

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.thread = SQLiteThread(self.path)
        self.history = History(self.thread)
        self.commits = GroupCommit(self)
        self._owner: Any = None  # the gateway's file lock, see lock_owner
        self._here: sqlite3.Connection | None = None  # the event loop's connection (group commits)
        self._checkpointed = 0.0
        self._checkpoint: asyncio.Future[Any] | None = None
        self._noted: set[int] = set()  # reservations whose stream's progress was kept (note_progress)
        self.owed: OwedLog | None = None  # the gateway's (serve): settlements its replies went out before
        self._owed_left: tuple[str, list[tuple[int, Reservation, UsageRecord]]] = ("", [])  # a crash's lines
        self._owed_pending = 0  # settlements with a line, not yet committed
        self._owed_retried: dict[int, Settle] = {}  # reservation id -> its first try, rescued (owed_retry)

    # -- plumbing -------------------------------------------------------------------------------
    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self.thread.run(fn)

    @property
    def database(self) -> SQLiteThread:
        return self.thread

    async def open(self) -> None:
        await self.thread.open()
        await self.thread.migrate("schema_version", MIGRATIONS)
        await self.thread.migrate(budgets.VERSION_TABLE, ddl("sqlite", budgets.TABLES))
        await self.thread.migrate(end_users.VERSION_TABLE, end_users.MIGRATIONS["sqlite"])
        if self._here is None:
            self._here = self.thread.connect_here()

    async def serve(self, settings: StoreSettings) -> None:
        self.lock_owner()  # one gateway per SQLite file
        await self.reconcile()  # reservations of an older version's crash, if any
        if self.path != ":memory:":  # its lines are settled by recover_stopped, after the journal's replay
            self.owed = OwedLog(Path(self.path + ".owed"))
            self._owed_left = self.owed.open()

    @property
    def owes(self) -> bool:
        return self.owed is not None and bool(self.owed.epoch)

    async def close(self) -> None:
        await self.commits.flush()  # settle what is queued before closing
        if self._here is not None:
            self._here.close()
            self._here = None
        if self._checkpoint is not None:
            await asyncio.wait((self._checkpoint,))
        if self.owed is not None:
            self.owed.close()
            self.owed = None
        await self.thread.close()
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def commit_here(self, ops: list[Callable[[sqlite3.Connection], Any]]) -> list[tuple[bool, Any]] | None:
        """A group commit on the event loop's connection (see :class:`GroupCommit`); None (nothing
        done) if there is none or another connection is writing."""
        db = self._here
        if db is None:
            return None
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # locked by another writer: the store's thread waits for it
            return None
        results = GroupCommit._apply(db, ops, begun=True)
        now = time.monotonic()
        if self._checkpoint is None and now - self._checkpointed > CHECKPOINT_EVERY:
            self._checkpointed = now
            self._checkpoint = asyncio.ensure_future(self.run(_checkpoint))
            self._checkpoint.add_done_callback(self._checkpoint_done)
        return results

    def upstream_wait(self) -> None:
        self.commits.quiet()

    def _checkpoint_done(self, done: asyncio.Future[Any]) -> None:
        self._checkpoint = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("WAL checkpoint failed: %r", done.exception())

    # -- groups ---------------------------------------------------------------------------------
    async def principal(self, key_hash: str) -> Principal | None:
        return await self.run(
            lambda db: principal_row(
                db.execute(_PRINCIPAL_BY_HASH, (key_hash, key_hash)).fetchone(), key_hash
            )
        )

    # -- ledger ---------------------------------------------------------------------------------
    @staticmethod
    def _settle(db: sqlite3.Connection, reservation: Reservation, record: UsageRecord) -> int:
        return settle_rows(db, [(reservation, record)])[0]

    async def ledger_state(self, group_id: int, key_id: int) -> tuple[int, int | None]:
        """The group's balance and the key's room under its spend cap (None: no cap), for
        :class:`billing.ledger.LocalLedger`."""

        def fn(db: sqlite3.Connection) -> tuple[int, int | None]:
            row = db.execute("SELECT balance FROM groups WHERE id = ?", (group_id,)).fetchone()
            key = db.execute("SELECT spend_cap, spent, reserved FROM keys WHERE id = ?", (key_id,)).fetchone()
            if row is None or key is None:
                raise StoreError(f"no group {group_id} or key {key_id}")
            room = None if key[0] is None else key[0] - key[1] - key[2]
            return row[0], room

        if self._here is not None:
            # on the group commits' own connection, between two of them: a read on the thread could
            # start before a commit and land after the ledger let go of that call's hold, and the
            # charge would be forgotten until the next read (calls admitted past the balance)
            try:
                return fn(self._here)
            except sqlite3.Error as exc:
                if down(exc):
                    raise StoreDown(f"the SQLite database {self.path} cannot be read now ({exc})") from exc
                raise
        return await self.run(fn)

    def lock_owner(self) -> None:
        """Take the file lock that makes this process the only gateway spending from this database
        (the CLI and the console may still write to it: they only add credit or change keys)."""
        import fcntl

        if self.path == ":memory:" or self._owner is not None:
            return
        # "a+": opening must not empty the file while another process holds it (it names that process)
        lock = open(self.path + ".gateway-lock", "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip()
            lock.close()
            raise StoreError(
                f"another gateway process{f' (pid {holder})' if holder.isdigit() else ''} already serves "
                f"from {self.path}: SQLite takes one gateway per database file (use PostgreSQL for several "
                "replicas)"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._owner = lock

    def settle_soon(
        self, reservation: Reservation, record: UsageRecord, linger: bool = False, owed: bool = False
    ) -> asyncio.Future[int]:
        """Queue the settlement for the next group commit; the future resolves once it committed
        (``linger``: nobody waits for it, see GroupCommit.submit)."""
        noted = False
        if self._noted and reservation.id in self._noted:
            self._noted.discard(reservation.id)
            noted = True
        book = self.owed if owed and self.owes else None
        if book is None:
            return self.commits.submit(Settle(reservation, record, self.clock(), noted=noted), linger)
        seq = book.write(reservation, record)  # survives the process from here: the reply may go out
        self._owed_pending += 1
        settling = self.commits.submit(
            Settle(reservation, record, self.clock(), noted=noted, epoch=book.epoch, owed=seq), linger
        )
        settling.add_done_callback(partial(self._owed_done, reservation.id))
        return settling

    def _owed_done(self, reservation_id: int, _: asyncio.Future[int]) -> None:
        self._owed_pending -= 1
        if self._owed_retried:
            self._owed_retried.pop(reservation_id, None)
        if not self._owed_pending and self.owed is not None:
            self.owed.truncate()  # every line is applied (or journaled): the file starts over

    def owed_retry(self, op: Settle) -> str:
        """A settlement with a line whose first write failed (GroupCommit, to Store.rescue): its retry
        records that line as applied, its journal entry has the line's id (billing/owed.py)."""
        if not op.owed:
            return ""
        self._owed_retried[op.reservation.id] = op
        return entry_id(op.epoch, op.owed)

    def settle_again(self, reservation: Reservation, record: UsageRecord) -> asyncio.Future[int]:
        first = self._owed_retried.get(reservation.id)  # (kept for each retry until the settlement is done)
        epoch, seq = (first.epoch, first.owed) if first is not None else ("", 0)
        return self.commits.submit(
            Settle(
                reservation, record, self.clock(), again=True, noted=reservation.id < 0, epoch=epoch, owed=seq
            )
        )

    def note_progress(self, progress: list[Checkpoint]) -> asyncio.Future[None]:
        """In the group commit, before the settlements queued after it (which remove the rows)."""
        self._noted.update([c.reservation for c in progress])
        return self.commits.submit(partial(_note_progress, rows=progress), linger=True)

    async def recover_stopped(self) -> int:
        """The lines of the owed log no group commit applied (each once: as a journal entry), then the
        streams left in progress, each charged what it had generated at its last checkpoint (an
        ``interrupted`` record), their rows removed: one transaction. Then a new epoch of the log."""
        owed = 0
        if self.owed is not None:
            epoch, lines = self._owed_left
            if lines:
                owed = await self._settle_owed(epoch, lines)
            self.owed.begin()  # (after the lines are settled: a crash before leaves them to the next start)
            self._owed_left = ("", [])
            await self.run(
                lambda db: db.execute("DELETE FROM owed_applied WHERE epoch <> ?", (self.owed_epoch,))
            )
        return owed + await self._charge_cut_streams()

    @property
    def owed_epoch(self) -> str:
        return self.owed.epoch if self.owed is not None else ""

    async def _settle_owed(self, epoch: str, lines: list[tuple[int, Reservation, UsageRecord]]) -> int:
        def applied(db: sqlite3.Connection) -> list[tuple[int, int]]:
            return db.execute("SELECT lo, hi FROM owed_applied WHERE epoch = ?", (epoch,)).fetchall()

        ranges = await self.run(applied)
        todo = [
            Entry(entry_id(epoch, seq), r, record)
            for seq, r, record in lines
            if not any(lo <= seq <= hi for lo, hi in ranges)
        ]
        if not todo:
            return 0
        done = sum((await self.replay(todo)).values())
        log.warning("settled %d charges a stopped process owed (its replies had gone out)", done)
        return done

    async def _charge_cut_streams(self) -> int:

        def fn(db: sqlite3.Connection) -> list[int]:
            with transaction(db):
                records = [
                    _cut_stream(db, *row)
                    for row in db.execute(
                        "SELECT reservation, record, completion, at FROM in_progress ORDER BY reservation"
                    ).fetchall()
                ]
                charges = (
                    settle_rows(db, [(Reservation(0, r.group_id, r.key_id, 0), r) for r in records])
                    if records
                    else []
                )
                db.execute("DELETE FROM in_progress")
                db.execute("DELETE FROM in_progress_text")
            return charges

        charges = await self.run(fn)
        if charges:
            log.warning(
                "charged %d streams cut by a stop for what they had generated: %s credits",
                len(charges),
                sum(charges) / NANO,
            )
        return len(charges)

    async def replay(self, entries: Sequence[Entry]) -> dict[str, bool]:
        return await self.run(partial(replay_rows, entries=entries))

    async def reconcile(self, older_than: float | None = None) -> int:
        def fn(db: sqlite3.Connection) -> int:
            cutoff = time.time() - older_than if older_than is not None else float("inf")
            rows = db.execute(
                "SELECT id, group_id, key_id, amount FROM reservations WHERE created_at <= ?", (cutoff,)
            ).fetchall()
            with transaction(db):
                for rid, group_id, key_id, amount in rows:
                    record = UsageRecord(
                        key_id=key_id,
                        group_id=group_id,
                        model="",
                        provider="",
                        status="interrupted",
                        usage_exact=False,
                        error="reservation left by a stopped process, released on restart",
                    )
                    self._settle(db, Reservation(rid, group_id, key_id, amount), record)
            return len(rows)

        return await self.run(fn)
