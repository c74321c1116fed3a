"""The store interface: groups, keys, balances, reservations and usage, behind one async API.

Implementations: :mod:`billing.sqlite` (embedded default) and :mod:`billing.postgres` (several
replicas); :func:`billing.backends.open_store` picks one from the store URL. Each store owns one database handle
(``store.database``: :class:`billing.sqlite_thread.SQLiteThread` or
:class:`billing.postgres_pool.PostgresPool`), which the jobs store and the console share; the usage
history is queried through ``store.history`` (:class:`billing.history.History`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar

import msgspec

from billing.database import Database
from billing.records import ModelUsage, Reservation, UsageRecord
from core.clock import Clock

if TYPE_CHECKING:
    from billing.history import History
    from billing.journal import Entry
    from core.config import StoreSettings

T = TypeVar("T")


class StoreError(Exception):
    """A store operation could not be done (unknown group, duplicate name, ...)."""


class StoreConstraint(StoreError):
    """A statement broke a constraint of the schema (a unique name or hash, a check, a reference): what
    both database handles raise for it (``Database``), for the store to say which."""


class StoreDown(Exception):
    """The store cannot be used now (unreachable, locked past its busy timeout, an I/O error): the
    operation may succeed later. Callers answer 503 ``store_unavailable``; settlements are retried."""


@dataclass(frozen=True, slots=True)
class Group:
    id: int
    name: str
    balance: int  # nano-credits available (reservations already taken out)
    reserved: int  # nano-credits held by calls in flight
    spent: int  # nano-credits settled so far
    created_at: float


@dataclass(frozen=True, slots=True)
class KeyInfo:
    id: int
    group_id: int
    group_name: str
    name: str
    hint: str  # the key's prefix and last four characters, for display
    created_at: float
    revoked_at: float | None
    spend_cap: int | None  # nano-credits, None = no cap
    spent: int
    allowed_models: tuple[str, ...] | None
    expires_at: float | None = None  # after it the key answers 401 key_expired
    tags: tuple[str, ...] = ()
    owner: str = ""
    last_used_at: float | None = None  # written in batches (gateway/auth.py: LastUsed), not per call
    rotated_until: float | None = None  # the secret replaced by the last rotation works until then


@dataclass(frozen=True, slots=True)
class KeyMeta:
    """A key's lifecycle fields as an operator sets them: its expiry (None: never), tags and owner."""

    expires_at: float | None = None
    tags: tuple[str, ...] = ()
    owner: str = ""


# the columns of a KeyInfo (``keys k JOIN groups g``), read by key_row; the same in every store
KEY_COLUMNS = (
    "k.id, k.group_id, g.name, k.name, k.hint, k.created_at, k.revoked_at, k.spend_cap, k.spent, "
    "k.allowed_models, k.expires_at, k.tags, k.owner, k.last_used_at, k.prev_until"
)
KEY_SQL = f"SELECT {KEY_COLUMNS} FROM keys k JOIN groups g ON g.id = k.group_id"


GROUP_COLS = "id, name, balance, reserved, spent, created_at"


def group_row(row: Sequence[Any]) -> Group:
    return Group(id=row[0], name=row[1], balance=row[2], reserved=row[3], spent=row[4], created_at=row[5])


def key_row(row: Sequence[Any]) -> KeyInfo:
    allowed = tuple(json.loads(row[9])) if row[9] else None
    return KeyInfo(
        id=row[0],
        group_id=row[1],
        group_name=row[2],
        name=row[3],
        hint=row[4],
        created_at=row[5],
        revoked_at=row[6],
        spend_cap=row[7],
        spent=row[8],
        allowed_models=allowed,
        expires_at=row[10],
        tags=tuple(json.loads(row[11])) if row[11] else (),
        owner=row[12] or "",
        last_used_at=row[13],
        rotated_until=row[14],
    )


def meta_values(meta: KeyMeta | None) -> tuple[float | None, str | None, str]:
    """The ``expires_at, tags, owner`` column values of ``meta``."""
    meta = meta or KeyMeta()
    return meta.expires_at, json.dumps(list(meta.tags)) if meta.tags else None, meta.owner


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key and its group, as the request path needs them. ``deadline``: the
    time (epoch seconds) after which this secret no longer works (the key's expiry, or the end of
    a rotation's grace period for the secret it replaced); ``deadline_code`` says which."""

    key_id: int
    key_name: str
    group_id: int
    group_name: str
    spend_cap: int | None
    allowed_models: frozenset[str] | None
    deadline: float | None = None
    deadline_code: str = "key_expired"


_PRINCIPAL_COLUMNS = (
    "SELECT k.id, k.name, g.id, g.name, k.spend_cap, k.allowed_models, k.expires_at, k.key_hash, k.prev_until "
    "FROM keys k JOIN groups g ON g.id = k.group_id WHERE k.revoked_at IS NULL AND "
)


def principal_query(column: str, mark: str) -> str:
    """The SQL of a live (not revoked) key's :class:`Principal`, found by ``keys.<column> = <mark>``
    (``?`` for SQLite, ``$1`` for PostgreSQL); :func:`principal_row` turns its row into one."""
    return _PRINCIPAL_COLUMNS + f"k.{column} = {mark}"


def principal_by_hash_query(first: str, second: str) -> str:
    """The SQL of the live key whose secret (or whose secret before its last rotation) hashes to
    the digest bound to both marks (``?``, ``?`` for SQLite; ``$1``, ``$1`` for PostgreSQL)."""
    return _PRINCIPAL_COLUMNS + f"(k.key_hash = {first} OR k.prev_hash = {second})"


def principal_row(row: Any, digest: str | None = None) -> Principal | None:
    """The principal of a row of :func:`principal_query`; ``digest``: the hash the caller sent, which
    if it is not the key's current one is the secret a rotation replaced (valid until ``prev_until``)."""
    if row is None:
        return None
    allowed = frozenset(json.loads(row[5])) if row[5] else None
    deadline, code = row[6], "key_expired"
    if digest is not None and not hmac.compare_digest(row[7], digest):
        grace = row[8] if row[8] is not None else 0.0
        if deadline is None or grace < deadline:
            deadline, code = grace, "key_rotated"
    return Principal(row[0], row[1], row[2], row[3], row[4], allowed, deadline, code)


class Checkpoint(NamedTuple):
    """A stream's usage so far (billing/progress.py, Store.note_progress): how to charge it (its
    ``Charge`` as JSON; None: as its last checkpoint said), and the tokens of all the text it generated,
    at ``at`` (wall clock). Counts only: no checkpoint keeps a call's content."""

    reservation: int
    request_id: str | None
    charge: str | None
    completion: int
    at: float


_record_json = msgspec.json.Encoder()
_record_of = msgspec.json.Decoder(UsageRecord)


def record_text(record: UsageRecord) -> str:
    """A usage record as compact JSON (what a stream's checkpoint keeps: billing/progress.py)."""
    return _record_json.encode(record).decode()


def record_of(text: str | bytes) -> UsageRecord:
    return _record_of.decode(text)


@dataclass(slots=True)
class Hold:
    """What a reservation row keeps of its call (PostgreSQL), for the ``interrupted`` record written if
    the replica holding it dies (billing/leases.py)."""

    model: str
    provider: str
    request_id: str | None
    endpoint: str = "chat"
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a reservation was refused: the group's balance, the key's spend cap, or a budget window
    (``window``: which, and when it resets: billing/budgets.py)."""

    reason: str  # "balance" | "key_cap" | "budget"
    available: int
    needed: int
    window: str = ""
    resets_at: float = 0.0


class Rescue(Protocol):
    """:attr:`Store.rescue`: ``(reservation, record, began, future, error) -> bool``, for a first try
    (``began``: ``time.monotonic()`` when the store first tried it; ``entry_id``: the id its journal
    entry must have, if it has one already: billing/owed.py)."""

    def __call__(
        self,
        reservation: Reservation,
        record: UsageRecord,
        began: float,
        future: asyncio.Future[int],
        error: BaseException,
        entry_id: str = "",
    ) -> bool: ...


class Store(ABC):
    """Groups, keys and the ledger, on one database (``database``: the handle the jobs store and the
    console share; ``history``: the usage records read back).

    ``exclusive``: one gateway process alone spends from this store (SQLite), so its admission can be
    held in that process's memory (:class:`billing.ledger.LocalLedger`, chosen by
    :func:`billing.ledger.ledger_for`); otherwise every reservation is a row in the store, shared by
    the replicas."""

    url: str
    exclusive: ClassVar[bool] = False
    history: History
    # told of a settlement whose write failed (the ledger's retries and journal, billing/durable.py):
    # if it returns True it owns the settlement's future from then on; else the future gets the error
    rescue: Rescue | None = None
    clock: Clock = staticmethod(time.time)  # the wall clock budget windows are read on (core/clock.py)

    @property
    @abstractmethod
    def database(self) -> Database:
        """The store's one database handle (billing, jobs and the console run on it)."""

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None:
        """Commit what is queued, then close the database handle."""

    async def ping(self) -> None:
        """A trivial query, for readiness probes: raises if the store cannot answer."""
        await self.database.select("SELECT 1")

    @abstractmethod
    async def serve(self, settings: StoreSettings) -> None:
        """Make this process a gateway spending from the store (after ``open``): release what a
        stopped gateway left held, and (SQLite) take the lock that makes it the only one."""

    # groups and keys: dialect-neutral statements on the store's database handle, once for both stores
    async def create_group(self, name: str, credits: int) -> Group:
        if credits < 0:
            raise StoreError("a group's credits cannot be negative")
        try:
            rows = await self.database.select(
                f"INSERT INTO groups (name, balance, created_at) VALUES (?, ?, ?) RETURNING {GROUP_COLS}",
                (name, credits, time.time()),
            )
        except StoreConstraint:
            raise StoreError(f"a group named {name!r} already exists") from None
        return group_row(rows[0])

    async def get_group(self, name: str) -> Group | None:
        rows = await self.database.select(f"SELECT {GROUP_COLS} FROM groups WHERE name = ?", (name,))
        return group_row(rows[0]) if rows else None

    async def list_groups(self) -> list[Group]:
        binary = ' COLLATE "C"' if self.database.dialect == "postgresql" else ""  # (byte order, as SQLite's)
        return [
            group_row(r)
            for r in await self.database.select(f"SELECT {GROUP_COLS} FROM groups ORDER BY name{binary}")
        ]

    async def topup(self, name: str, amount: int) -> Group:
        if amount <= 0:
            raise StoreError("a top-up must be a positive amount")
        rows = await self.database.select(
            f"UPDATE groups SET balance = balance + ? WHERE name = ? RETURNING {GROUP_COLS}", (amount, name)
        )
        if not rows:
            raise StoreError(f"no group named {name!r}")
        return group_row(rows[0])

    async def create_key(
        self,
        group: str,
        name: str,
        key_hash: str,
        hint: str,
        spend_cap: int | None = None,
        allowed_models: list[str] | None = None,
        meta: KeyMeta | None = None,
    ) -> KeyInfo:
        found = await self.database.select("SELECT id FROM groups WHERE name = ?", (group,))
        if not found:
            raise StoreError(f"no group named {group!r}")
        try:
            rows = await self.database.select(
                "INSERT INTO keys (group_id, name, key_hash, hint, created_at, spend_cap, allowed_models, expires_at, "
                "tags, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    found[0][0],
                    name,
                    key_hash,
                    hint,
                    time.time(),
                    spend_cap,
                    json.dumps(allowed_models) if allowed_models else None,
                    *meta_values(meta),
                ),
            )
        except StoreConstraint:  # (groups are never deleted: the hash is what is taken)
            raise StoreError("a key with this hash already exists") from None
        return await self._changed_key(rows[0][0], 1)

    async def revoke_key(self, key_id: int) -> bool:
        changed = await self.database.atomic(
            [("UPDATE keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (time.time(), key_id))]
        )
        return changed[0] > 0

    async def update_key(
        self, key_id: int, spend_cap: int | None, allowed_models: list[str] | None
    ) -> KeyInfo:
        """Set a key's spend cap (nano-credits, None = no cap) and model allow-list (None = every model);
        raises StoreError if there is no such key."""
        if spend_cap is not None and spend_cap < 0:
            raise StoreError("a spend cap cannot be negative")
        changed = await self.database.atomic(
            [
                (
                    "UPDATE keys SET spend_cap = ?, allowed_models = ? WHERE id = ?",
                    (spend_cap, json.dumps(allowed_models) if allowed_models else None, key_id),
                )
            ]
        )
        return await self._changed_key(key_id, changed[0])

    async def get_key(self, key_id: int) -> KeyInfo | None:
        rows = await self.database.select(KEY_SQL + " WHERE k.id = ?", (key_id,))
        return key_row(rows[0]) if rows else None

    async def list_keys(self, group: str | None = None) -> list[KeyInfo]:
        if group is None:
            rows = await self.database.select(KEY_SQL + " ORDER BY k.id")
        else:
            rows = await self.database.select(KEY_SQL + " WHERE g.name = ? ORDER BY k.id", (group,))
        return [key_row(r) for r in rows]

    @abstractmethod
    async def principal(self, key_hash: str) -> Principal | None:
        """The live (not revoked) key with this hash (or whose secret before its last rotation has
        it), with its group and the secret's deadline; None if there is none."""

    # key lifecycle: dialect-neutral statements on the store's database handle
    async def set_key_meta(self, key_id: int, meta: KeyMeta) -> KeyInfo:
        """Set a key's expiry, tags and owner; raises StoreError if there is no such key."""
        changed = await self.database.atomic(
            [
                (
                    "UPDATE keys SET expires_at = ?, tags = ?, owner = ? WHERE id = ?",
                    (*meta_values(meta), key_id),
                )
            ]
        )
        return await self._changed_key(key_id, changed[0])

    async def rotate_key(self, key_id: int, key_hash: str, hint: str, grace: float) -> KeyInfo:
        """Give a live key a new secret (``key_hash``, ``hint``); the secret it had keeps working for
        ``grace`` seconds (0: stops at once). A second rotation ends the first one's grace."""
        changed = await self.database.atomic(
            [
                (
                    "UPDATE keys SET prev_hash = key_hash, prev_until = ?, key_hash = ?, hint = ? "
                    "WHERE id = ? AND revoked_at IS NULL",
                    (time.time() + grace, key_hash, hint, key_id),
                )
            ]
        )
        return await self._changed_key(key_id, changed[0], "no live key")

    async def touch_keys(self, used: dict[int, float]) -> None:
        """Record when keys were last used (one transaction for all of them; never moves backwards)."""
        if used:
            sql = (
                "UPDATE keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)"
            )
            await self.database.atomic([(sql, (ts, key_id, ts)) for key_id, ts in sorted(used.items())])

    async def _changed_key(self, key_id: int, changed: int, what: str = "no key") -> KeyInfo:
        info = await self.get_key(key_id) if changed else None
        if info is None:
            raise StoreError(f"{what} with id {key_id}")
        return info

    # ledger
    async def reserve(
        self,
        group_id: int,
        key_id: int,
        amount: int,
        hold: Hold | None = None,
    ) -> Reservation | Refusal:
        """Atomically move ``amount`` from the group's balance to reserved, if the balance (and the
        key's spend cap) allow it; never lets a balance go below zero, whatever runs concurrently.
        ``hold``: the call's model and request id, kept with a stored reservation. Only a store shared
        by replicas has stored reservations (not ``exclusive``): an exclusive store's are held in the
        gateway's memory (:class:`billing.ledger.LocalLedger`)."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps no reservations: billing.ledger.LocalLedger holds them"
        )

    @abstractmethod
    async def ledger_state(self, group_id: int, key_id: int) -> tuple[int, int | None]:
        """The group's balance and the key's room under its spend cap (None: no cap), as committed."""

    @property
    def owes(self) -> bool:
        """Whether :meth:`settle_soon` can make a settlement survive the process before its commit
        (``owed``: SQLite's owed log, billing/owed.py); else a reply waits for the commit."""
        return False

    @abstractmethod
    def settle_soon(
        self, reservation: Reservation, record: UsageRecord, linger: bool = False, owed: bool = False
    ) -> asyncio.Future[int]:
        """Start settling now: release the reservation, charge ``record.credits`` (capped at what the
        group has: the balance never goes below zero) and insert the usage record. The future
        resolves with the charge once it is durable. ``linger``: nobody waits for it, so the store
        may wait a little to commit it with others. ``owed``: a reply goes out as soon as this
        returns (where :attr:`owes`, the settlement survives the process from then on). If the write
        fails, the store offers the settlement to :attr:`rescue` (if set) before failing the future."""

    def upstream_wait(self) -> None:
        """A call is about to wait for its upstream: a moment when the event loop has no call's work
        to do, good for the store's own (see :class:`billing.sqlite.GroupCommit`). Nothing here."""
        return None

    async def settle(self, reservation: Reservation, record: UsageRecord) -> int:
        """:meth:`settle_soon`, waited for."""
        return await self.settle_soon(reservation, record)

    @abstractmethod
    def settle_again(self, reservation: Reservation, record: UsageRecord) -> asyncio.Future[int]:
        """A settlement retried after a failure whose outcome may be unknown: applied only if it was
        not already (billing/durable.py; SQLite knows the outcome of every failed transaction), and
        never offered to :attr:`rescue` (its retrier waits for it)."""

    @abstractmethod
    def note_progress(self, progress: list[Checkpoint]) -> Awaitable[None]:
        """Keep these streams' checkpoints (billing/progress.py): each stream's charge (in place of the
        one kept before, when it has one) and the tokens it generated so far (in place of the count kept
        before), until its settlement removes them in its own transaction. If the process dies first, the stream is
        charged (billing.progress.charged): by :meth:`recover_stopped` at the next start (SQLite), by
        the release of the dead replica's holds (PostgreSQL; billing/leases.py)."""

    async def recover_stopped(self) -> int:
        """At the start, after the settlement journal's replay, what a stopped process left (SQLite; on
        PostgreSQL the release of a dead replica's holds does it): the settlements it owed (replies
        that went out before their commit), then its streams in progress, charged for what they had
        generated at their last checkpoint. Returns how many records it wrote."""
        return 0

    @abstractmethod
    async def replay(self, entries: Sequence[Entry]) -> dict[str, bool]:
        """Apply journaled settlements in one transaction, each at most once (its id is kept in
        ``journal_applied``): for each entry handled, True if applied now, False if it was applied
        before (or the store refused it, logged). Raises StoreDown if the store cannot be used."""

    @abstractmethod
    async def reconcile(self, older_than: float | None = None) -> int:
        """Release reservations left by a crashed process (all, or those older than ``older_than``
        seconds), each leaving an ``interrupted`` usage record (charged what its stream had generated
        at its last checkpoint, if it had one: :meth:`note_progress`). Returns how many."""

    # usage
    async def usage(
        self,
        group: str | None = None,
        key_id: int | None = None,
        source: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[UsageRecord]:
        """Usage records, newest first."""
        return await self.history.usage(group, key_id, source, limit, before_id)

    async def usage_by_model(
        self, key_id: int, since: float = 0.0, until: float | None = None
    ) -> list[ModelUsage]:
        return await self.history.usage_by_model(key_id, since, until)
