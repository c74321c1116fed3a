"""``billing.ledger.LocalLedger`` on a real SQLite store: admission held in the process's memory (no
store round trip per call), never more than the group's balance or the key's cap, a hold let go only
once its settlement is durable, a top-up by another writer seen before any refusal. The whole path
(pipeline, Meter, the HTTP answer) is tested in test_billing.py; here the ledger's own promises."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from billing.ledger import LocalLedger, ledger_for
from billing.sqlite import SQLiteStore
from billing.store import KeyInfo, UsageRecord
from core.catalog import NANO
from core.errors import InsufficientCredits


@dataclass
class Books:
    store: SQLiteStore
    ledger: LocalLedger
    group_id: int
    key: KeyInfo

    def record(self, credits: int) -> UsageRecord:
        return UsageRecord(
            key_id=self.key.id,
            group_id=self.group_id,
            model="openai/gpt-4o-mini",
            provider="openai",
            credits=credits,
        )

    async def balance(self) -> int:
        group = await self.store.get_group("g")
        assert group is not None
        return group.balance


@pytest.fixture
async def books(tmp_path: Path) -> AsyncIterator[Books]:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'router.db'}")
    await store.open()
    try:
        group = await store.create_group("g", 10 * NANO)
        key = await store.create_key("g", "k", "h" * 64, "hint")
        ledger = ledger_for(store)
        assert isinstance(ledger, LocalLedger)  # SQLite: one process spends from the file
        yield Books(store, ledger, group.id, key)
    finally:
        await store.close()


async def test_worst_cases_in_flight_are_held_against_the_balance_in_memory(books: Books) -> None:
    first = await books.ledger.reserve(books.group_id, books.key.id, 6 * NANO)
    with pytest.raises(InsufficientCredits) as refused:
        await books.ledger.reserve(books.group_id, books.key.id, 5 * NANO)
    assert refused.value.code == "insufficient_credits" and "4" in refused.value.message  # 4 credits left
    assert first.id < 0 and await books.balance() == 10 * NANO  # nothing was written to the store
    assert await books.store.reconcile() == 0  # and nothing is left there to clean up after a crash


async def test_concurrent_calls_never_take_more_than_the_balance(books: Books) -> None:
    results = await asyncio.gather(
        *[books.ledger.reserve(books.group_id, books.key.id, NANO) for _ in range(25)], return_exceptions=True
    )
    assert sum(not isinstance(r, Exception) for r in results) == 10
    assert all(isinstance(r, InsufficientCredits) for r in results if isinstance(r, Exception))


async def test_a_hold_is_let_go_once_the_charge_is_durable(books: Books) -> None:
    reservation = await books.ledger.reserve(books.group_id, books.key.id, 9 * NANO)
    settled = books.ledger.queue(reservation, books.record(2 * NANO))
    with pytest.raises(InsufficientCredits):  # not durable yet: the hold of 9 still stands
        await books.ledger.reserve(books.group_id, books.key.id, 2 * NANO)
    assert await settled == 2 * NANO
    assert await books.balance() == 8 * NANO
    await books.ledger.reserve(books.group_id, books.key.id, 8 * NANO)  # the hold went, the charge stayed
    with pytest.raises(InsufficientCredits):
        await books.ledger.reserve(books.group_id, books.key.id, 1)


async def test_a_top_up_by_another_writer_is_seen_before_refusing(books: Books) -> None:
    await books.ledger.reserve(books.group_id, books.key.id, 10 * NANO)  # the balance is read, and held
    await books.store.topup("g", 3 * NANO)  # the CLI or the console, through the store
    await books.ledger.reserve(books.group_id, books.key.id, 3 * NANO)  # within the refresh time, yet seen
    with pytest.raises(InsufficientCredits):
        await books.ledger.reserve(books.group_id, books.key.id, 1)


async def test_a_keys_spend_cap_is_held_the_same_way(books: Books) -> None:
    capped = await books.store.create_key("g", "capped", "c" * 64, "hint", spend_cap=3 * NANO)
    await books.ledger.reserve(books.group_id, capped.id, 2 * NANO)
    with pytest.raises(InsufficientCredits) as refused:
        await books.ledger.reserve(books.group_id, capped.id, 2 * NANO)
    assert refused.value.code == "key_spend_cap_reached"
    await books.ledger.reserve(books.group_id, books.key.id, 7 * NANO)  # the group's other key: the rest


async def test_a_balance_read_is_refreshed_ahead_and_no_call_waits_for_it(books: Books) -> None:
    """Past half its ``refresh``, a group's balance is read again in the background while calls go on with
    the value read before (still within ``refresh``): under another group's burst that read queues behind
    the burst's store work, and this group's calls must not queue with it. Past ``refresh`` a call waits."""
    ledger, store = books.ledger, books.store
    ledger.refresh = 0.4
    await ledger.reserve(books.group_id, books.key.id, NANO)  # the first read
    reads, gate = [], asyncio.Event()
    plain = store.ledger_state

    async def slow(group_id: int, key_id: int) -> tuple[int, int | None]:
        reads.append(group_id)
        await gate.wait()  # (the store is busy with somebody else's work)
        return await plain(group_id, key_id)

    store.ledger_state = slow  # type: ignore[method-assign]
    await asyncio.sleep(0.25)  # past half the refresh
    for _ in range(5):  # none waits for the read they started
        await asyncio.wait_for(ledger.reserve(books.group_id, books.key.id, NANO), 0.05)
    assert reads == [books.group_id]  # one read, ahead of time
    await asyncio.sleep(0.2)  # past the refresh: a call waits for a fresh value
    waiting = asyncio.ensure_future(ledger.reserve(books.group_id, books.key.id, NANO))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.set()
    await asyncio.wait_for(waiting, 1)
