"""The store interface: groups, keys, balances, reservations and usage, behind one async API.

Implementations: :mod:`billing.sqlite` (embedded default) and :mod:`billing.postgres` (several
replicas). ``open_store(url)`` picks one from the store URL.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class StoreError(Exception):
    """A store operation could not be done (unknown group, duplicate name, ...)."""


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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key and its group, as the request path needs them."""

    key_id: int
    key_name: str
    group_id: int
    group_name: str
    spend_cap: int | None
    allowed_models: frozenset[str] | None


def principal_query(column: str, mark: str) -> str:
    """The SQL of a live (not revoked) key's :class:`Principal`, found by ``keys.<column> = <mark>``
    (``?`` for SQLite, ``$1`` for PostgreSQL); :func:`principal_row` turns its row into one."""
    return (
        "SELECT k.id, k.name, g.id, g.name, k.spend_cap, k.allowed_models FROM keys k "
        f"JOIN groups g ON g.id = k.group_id WHERE k.{column} = {mark} AND k.revoked_at IS NULL"
    )


def principal_row(row: Any) -> Principal | None:
    if row is None:
        return None
    allowed = frozenset(json.loads(row[5])) if row[5] else None
    return Principal(row[0], row[1], row[2], row[3], row[4], allowed)


@dataclass(slots=True)
class UsageRecord:
    """One call, as design §6 lists it. ``credits`` is what was charged, in nano-credits."""

    key_id: int
    group_id: int
    model: str
    provider: str
    endpoint: str = "chat"
    source: str = "api"  # api | job
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    credits: int = 0
    status: str = "ok"  # ok | error | interrupted
    usage_exact: bool = True
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    upstream_request_id: str | None = None
    request_id: str | None = None
    error: str | None = None
    ts: float = 0.0
    id: int = 0


def usage_record(row: Any) -> UsageRecord:
    """A ``usage`` row (``id`` then the columns in design §6 order), from any of the stores."""
    return UsageRecord(
        id=row[0], ts=row[1], key_id=row[2], group_id=row[3], model=row[4], provider=row[5], endpoint=row[6],
        source=row[7], stream=bool(row[8]), prompt_tokens=row[9], completion_tokens=row[10], cached_tokens=row[11],
        cache_write_tokens=row[12], reasoning_tokens=row[13], credits=row[14], status=row[15],
        usage_exact=bool(row[16]), latency_ms=row[17], ttft_ms=row[18], upstream_request_id=row[19],
        request_id=row[20], error=row[21],
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reservation:
    id: int
    group_id: int
    key_id: int
    amount: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a reservation was refused: the group's balance, or the key's spend cap."""

    reason: str  # "balance" | "key_cap"
    available: int
    needed: int


@dataclass(frozen=True, slots=True)
class ModelUsage:
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    credits: int


class Store(ABC):
    url: str

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def ping(self) -> None:
        """A trivial query, for readiness probes: raises if the store cannot answer. Stores override
        it with something cheaper (``SELECT 1``)."""
        await self.get_group("")

    # groups
    @abstractmethod
    async def create_group(self, name: str, credits: int) -> Group: ...

    @abstractmethod
    async def get_group(self, name: str) -> Group | None: ...

    @abstractmethod
    async def list_groups(self) -> list[Group]: ...

    @abstractmethod
    async def topup(self, name: str, amount: int) -> Group: ...

    # keys
    @abstractmethod
    async def create_key(
        self,
        group: str,
        name: str,
        key_hash: str,
        hint: str,
        spend_cap: int | None = None,
        allowed_models: list[str] | None = None,
    ) -> KeyInfo: ...

    @abstractmethod
    async def revoke_key(self, key_id: int) -> bool: ...

    @abstractmethod
    async def update_key(self, key_id: int, spend_cap: int | None, allowed_models: list[str] | None) -> KeyInfo:
        """Set a key's spend cap (nano-credits, None = no cap) and model allow-list (None = every model);
        raises StoreError if there is no such key."""

    @abstractmethod
    async def list_keys(self, group: str | None = None) -> list[KeyInfo]: ...

    @abstractmethod
    async def principal(self, key_hash: str) -> Principal | None:
        """The live (not revoked) key with this hash, with its group; None if there is none."""

    # ledger
    @abstractmethod
    async def reserve(self, group_id: int, key_id: int, amount: int) -> Reservation | Refusal:
        """Atomically move ``amount`` from the group's balance to reserved, if the balance (and the
        key's spend cap) allow it; never lets a balance go below zero, whatever runs concurrently."""

    @abstractmethod
    async def settle(self, reservation: Reservation, record: UsageRecord) -> int:
        """Release the reservation, charge ``record.credits`` (capped at what the group has: the
        balance never goes below zero) and insert the usage record, durably. Returns the charge."""

    @abstractmethod
    async def reconcile(self, older_than: float | None = None) -> int:
        """Release reservations left by a crashed process (all, or those older than ``older_than``
        seconds), each leaving an ``interrupted`` usage record. Returns how many."""

    @abstractmethod
    async def usage(self, group: str | None = None, key_id: int | None = None, source: str | None = None,
                    limit: int = 100, before_id: int | None = None) -> list[UsageRecord]:  # fmt: skip
        """Usage records, newest first."""

    @abstractmethod
    async def usage_by_model(self, key_id: int, since: float = 0.0, until: float | None = None) -> list[ModelUsage]: ...


def open_store(url: str) -> Store:
    if url.startswith("sqlite://"):
        from billing.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgres://", "postgresql://")):
        from billing.postgres import PostgresStore  # type: ignore[import-not-found]

        return PostgresStore(url)
    raise StoreError(f"unsupported store URL {url!r}: use sqlite:///path or postgresql://...")


async def with_store(url: str, action: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store at ``url``, run ``action`` on it, close it (the CLI's one-shot commands)."""
    store = open_store(url)
    await store.open()
    try:
        return await action(store)
    finally:
        await store.close()
