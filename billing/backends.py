"""The composition root of the billing stores: the one place that picks a store from its URL (SQLite
for one process, PostgreSQL for several replicas); billing/store.py, the interface, imports neither."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from billing.store import Store, StoreError
from core.clock import clock

T = TypeVar("T")


def open_store(url: str) -> Store:
    store: Store
    if url.startswith("sqlite://"):
        from billing.sqlite import SQLiteStore

        store = SQLiteStore(url)
    elif url.startswith(("postgres://", "postgresql://")):
        from billing.postgres import PostgresStore

        store = PostgresStore(url)
    else:
        raise StoreError(f"unsupported store URL {url!r}: use sqlite:///path or postgresql://...")
    store.clock = clock()
    return store


async def with_store(url: str, action: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store at ``url``, run ``action`` on it, close it (the CLI's one-shot commands)."""
    store = open_store(url)
    await store.open()
    try:
        return await action(store)
    finally:
        await store.close()
