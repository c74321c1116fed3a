"""The store interface: groups, keys, balances, reservations and usage, behind one async API.

Implementations: :mod:`billing.sqlite` (embedded default) and :mod:`billing.postgres` (several
replicas). ``open_store(url)`` picks one from the store URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


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


class Store(ABC):
    url: str

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

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
    async def list_keys(self, group: str | None = None) -> list[KeyInfo]: ...

    @abstractmethod
    async def principal(self, key_hash: str) -> Principal | None:
        """The live (not revoked) key with this hash, with its group; None if there is none."""


def open_store(url: str) -> Store:
    if url.startswith("sqlite://"):
        from billing.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgres://", "postgresql://")):
        from billing.postgres import PostgresStore  # type: ignore[import-not-found]

        return PostgresStore(url)
    raise StoreError(f"unsupported store URL {url!r}: use sqlite:///path or postgresql://...")
