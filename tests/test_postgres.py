"""The PostgreSQL store: the store contract, run against both stores (SQLite in a temporary
directory, PostgreSQL in a temporary database), and gateway replicas sharing one PostgreSQL.

These tests need a PostgreSQL server (``postgresql://postgres@127.0.0.1:5432/postgres``, or the URL in
``$ROUTER_TEST_POSTGRES``): they fail, never skip, when it cannot be reached. The session creates a
database ``router_test_<random>`` (one schema per test in it) and drops it at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import openai
import pytest

from billing.backends import open_store
from billing.postgres import MIGRATIONS, PostgresStore, migrate
from billing.postgres_ledger import usable
from billing.store import Refusal, Reservation, Store, StoreError, UsageRecord
from emulators.registry import Running, start_emulators, stop_emulators
from tests.conftest import Postgres, Stack, free_port, wait_healthy

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def pg_url(pg: Postgres) -> str:
    return pg.fresh_url()


@contextlib.asynccontextmanager
async def _opened(url: str) -> AsyncIterator[Store]:
    s = open_store(url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    async with _opened(url) as s:
        yield s


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    """A store whose reservations are rows, shared by replicas (PostgreSQL; SQLite's are held in the
    gateway's memory: billing.ledger.LocalLedger, tests/test_local_ledger.py)."""
    async with _opened(pg_url) as s:
        yield s


def usage(key_id: int, group_id: int, credits: int, **kw: Any) -> UsageRecord:
    return UsageRecord(
        key_id=key_id,
        group_id=group_id,
        model=kw.pop("model", "openai/gpt-4o-mini"),
        provider="openai",
        credits=credits,
        **kw,
    )


async def team(store: Store, credits: int, name: str = "team", cap: int | None = None) -> tuple[int, int]:
    """A group and one key in it: (group id, key id)."""
    group = await store.create_group(name, credits)
    key = await store.create_key(name, "k", secrets.token_hex(16), "sk-mr-...abcd", spend_cap=cap)
    return group.id, key.id


async def ledger(store: Store, name: str = "team") -> tuple[int, int, int]:
    group = await store.get_group(name)
    assert group is not None
    return group.balance, group.reserved, group.spent


# -- the contract, on both stores (reservations: PostgreSQL's) ------------------------------------------
async def test_migrations_are_idempotent(url: str) -> None:
    first = open_store(url)
    await first.open()
    try:
        await first.create_group("kept", 5)
    finally:
        await first.close()
    racing = [open_store(url) for _ in range(3)]  # replicas starting together
    await asyncio.gather(*(s.open() for s in racing))
    try:
        for s in racing:
            assert [g.name for g in await s.list_groups()] == ["kept"]
    finally:
        for s in racing:
            await s.close()


async def test_groups_keys_principal_and_revoke(store: Store) -> None:
    group = await store.create_group("beta", 1_000)
    assert (group.name, group.balance, group.reserved, group.spent) == ("beta", 1_000, 0, 0)
    await store.create_group("Alpha", 0)
    assert [g.name for g in await store.list_groups()] == ["Alpha", "beta"]  # byte order, as SQLite
    with pytest.raises(StoreError, match="already exists"):
        await store.create_group("beta", 1)
    with pytest.raises(StoreError):
        await store.create_group("neg", -1)
    assert await store.get_group("nobody") is None
    assert (await store.topup("beta", 500)).balance == 1_500
    for bad in (0, -5):
        with pytest.raises(StoreError):
            await store.topup("beta", bad)
    with pytest.raises(StoreError, match="no group named"):
        await store.topup("nobody", 5)

    key = await store.create_key("beta", "ci", "hash-1", "sk-mr-...wxyz", 300, ["openai/gpt-4o"])
    with pytest.raises(
        StoreError, match="a key with this hash already exists"
    ):  # the same error on both stores
        await store.create_key("Alpha", "again", "hash-1", "sk-mr-...wxyz")
    assert (key.group_id, key.group_name, key.name) == (group.id, "beta", "ci")
    assert (key.spend_cap, key.spent) == (300, 0)
    assert key.allowed_models == ("openai/gpt-4o",) and key.revoked_at is None
    plain = await store.create_key("Alpha", "", "hash-2", "sk-mr-...0000")
    assert plain.allowed_models is None and plain.spend_cap is None
    with pytest.raises(StoreError, match="no group named"):
        await store.create_key("nobody", "x", "hash-3", "h")
    assert [k.id for k in await store.list_keys()] == [key.id, plain.id]
    assert [k.id for k in await store.list_keys("beta")] == [key.id]

    principal = await store.principal("hash-1")
    assert principal is not None
    assert (principal.key_id, principal.key_name) == (key.id, "ci")
    assert (principal.group_id, principal.group_name) == (group.id, "beta")
    assert principal.spend_cap == 300 and principal.allowed_models == frozenset({"openai/gpt-4o"})
    assert await store.principal("no-such-hash") is None
    assert await store.revoke_key(key.id) is True
    assert await store.revoke_key(key.id) is False
    assert await store.principal("hash-1") is None
    assert (await store.list_keys("beta"))[0].revoked_at is not None


async def test_update_key_and_ping(store: Store) -> None:
    await store.ping()
    await store.create_group("g", 10)
    key = await store.create_key("g", "k", "hash-u", "h")
    updated = await store.update_key(key.id, 500, ["a/b"])
    assert (updated.id, updated.spend_cap, updated.allowed_models) == (key.id, 500, ("a/b",))
    principal = await store.principal("hash-u")
    assert principal is not None and principal.spend_cap == 500 and principal.allowed_models == {"a/b"}
    cleared = await store.update_key(key.id, None, None)
    assert (cleared.spend_cap, cleared.allowed_models) == (None, None)
    with pytest.raises(StoreError):
        await store.update_key(key.id + 99, None, None)
    with pytest.raises(StoreError):
        await store.update_key(key.id, -1, None)


async def test_reserve_refuses_beyond_the_balance(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 1_000)
    first = await store.reserve(group_id, key_id, 600)
    assert isinstance(first, Reservation)
    assert (first.group_id, first.key_id, first.amount) == (group_id, key_id, 600)
    assert await store.reserve(group_id, key_id, 401) == Refusal("balance", 400, 401)
    second = await store.reserve(group_id, key_id, 400)
    assert isinstance(second, Reservation) and second.id != first.id
    assert await store.reserve(group_id, key_id, 1) == Refusal("balance", 0, 1)
    assert await ledger(store) == (0, 1_000, 0)
    assert await store.reserve(group_id + 100, key_id, 1) == Refusal("balance", 0, 1)  # no such group


async def test_reserve_refuses_beyond_the_key_cap(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 10_000, cap=1_000)
    held = await store.reserve(group_id, key_id, 700)
    assert isinstance(held, Reservation)
    assert await store.reserve(group_id, key_id, 301) == Refusal("key_cap", 300, 301)
    await store.settle(held, usage(key_id, group_id, 500))  # spent 500 of the cap
    assert await store.reserve(group_id, key_id, 501) == Refusal("key_cap", 500, 501)
    assert isinstance(await store.reserve(group_id, key_id, 500), Reservation)
    assert await store.reserve(group_id, key_id, 1) == Refusal("key_cap", 0, 1)
    poor_group, poor_key = await team(store, 10, name="poor", cap=5)
    # the cap is checked first
    assert await store.reserve(poor_group, poor_key, 50) == Refusal("key_cap", 5, 50)
    assert (await store.list_keys("team"))[0].spent == 500


async def test_settle_charges_the_exact_cost_and_records_the_call(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 10_000)
    reservation = await store.reserve(group_id, key_id, 3_000)
    assert isinstance(reservation, Reservation)
    record = usage(
        key_id,
        group_id,
        1_234,
        endpoint="chat",
        source="job",
        stream=True,
        prompt_tokens=11,
        completion_tokens=22,
        cached_tokens=3,
        cache_write_tokens=4,
        reasoning_tokens=5,
        status="ok",
        usage_exact=False,
        latency_ms=12.5,
        ttft_ms=3.25,
        upstream_request_id="up-1",
        request_id="req-1",
        error=None,
        ts=1_700_000_000.5,
    )
    assert await store.settle(reservation, record) == 1_234
    assert record.credits == 1_234
    assert await ledger(store) == (10_000 - 1_234, 0, 1_234)
    assert (await store.list_keys())[0].spent == 1_234
    [saved] = await store.usage(group="team")
    assert saved.id > 0
    expected = {**vars_of(record), "id": saved.id}
    assert vars_of(saved) == expected
    [by_model] = await store.usage_by_model(key_id)
    assert (by_model.model, by_model.calls, by_model.credits) == ("openai/gpt-4o-mini", 1, 1_234)
    assert (by_model.prompt_tokens, by_model.completion_tokens) == (11, 22)


def vars_of(record: UsageRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in UsageRecord.__dataclass_fields__}


async def test_settle_is_capped_at_what_the_group_has(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 1_000)
    reservation = await store.reserve(group_id, key_id, 400)
    assert isinstance(reservation, Reservation)
    record = usage(key_id, group_id, 5_000)  # costs more than reserved and more than the balance
    assert await store.settle(reservation, record) == 1_000  # the charge is returned ...
    assert record.credits == 5_000  # ... not written into the caller's record
    assert await ledger(store) == (0, 0, 1_000)
    assert [u.credits for u in await store.usage(group="team")] == [1_000]


async def test_settling_twice_releases_the_hold_once(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 1_000)
    reservation = await store.reserve(group_id, key_id, 600)
    assert isinstance(reservation, Reservation)
    assert await store.settle(reservation, usage(key_id, group_id, 100)) == 100
    assert await ledger(store) == (900, 0, 100)
    # the second settle finds no reservation: nothing to release; its charge is capped at the balance
    assert await store.settle(reservation, usage(key_id, group_id, 5_000)) == 900
    assert await ledger(store) == (0, 0, 1_000)
    assert len(await store.usage(group="team")) == 2


async def test_a_failing_operation_does_not_fail_the_others(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 1_000)
    results = await asyncio.gather(
        store.reserve(group_id, key_id, 100),
        store.reserve(group_id, key_id + 999, 100),  # no such key
        store.reserve(group_id, key_id, 200),
        return_exceptions=True,
    )
    assert isinstance(results[0], Reservation) and isinstance(results[2], Reservation)
    assert isinstance(results[1], Exception)
    assert await ledger(store) == (700, 300, 0)


async def test_reconcile_releases_what_a_crash_left(pg_url: str) -> None:
    url = pg_url
    crashed = open_store(url)
    await crashed.open()
    group_id, key_id = await team(crashed, 10_000, cap=10_000)
    held = [await crashed.reserve(group_id, key_id, amount) for amount in (1_000, 2_000, 3_000)]
    assert all(isinstance(r, Reservation) for r in held)
    await crashed.settle(held[0], usage(key_id, group_id, 700))  # type: ignore[arg-type]
    await crashed.close()  # the process "dies" with two calls in flight

    restarted = open_store(url)
    await restarted.open()
    try:
        assert await ledger(restarted) == (10_000 - 700 - 5_000, 5_000, 700)
        assert await restarted.reconcile(older_than=3_600) == 0  # too recent to be a crash's
        assert await restarted.reconcile(older_than=0) == 2
        balance, reserved, spent = await ledger(restarted)
        assert reserved == 0 and balance + spent == 10_000 and spent == 700
        records = await restarted.usage(group="team")
        assert [r.status for r in records] == ["interrupted", "interrupted", "ok"]
        assert all(r.credits == 0 and not r.usage_exact for r in records[:2])
        assert await restarted.reconcile() == 0
        # the key's holds were released too: its whole cap minus what it spent is available again
        assert isinstance(await restarted.reserve(group_id, key_id, 10_000 - 700), Reservation)
    finally:
        await restarted.close()


async def test_usage_filters_and_pages_newest_first(pg_store: Store) -> None:
    store = pg_store
    group_id, key_id = await team(store, 10_000)
    other_group, other_key = await team(store, 10_000, name="other")
    for n, (source, model) in enumerate([("api", "a/x"), ("job", "a/y"), ("api", "a/x"), ("job", "a/x")]):
        r = await store.reserve(group_id, key_id, 100)
        assert isinstance(r, Reservation)
        await store.settle(
            r, usage(key_id, group_id, 10 + n, source=source, model=model, prompt_tokens=n, ts=1_000.0 + n)
        )
    r = await store.reserve(other_group, other_key, 100)
    assert isinstance(r, Reservation)
    await store.settle(r, usage(other_key, other_group, 99))
    mine = await store.usage(group="team")
    assert [u.credits for u in mine] == [13, 12, 11, 10]
    assert [u.credits for u in await store.usage(group="team", source="job")] == [13, 11]
    assert [u.credits for u in await store.usage(key_id=other_key)] == [99]
    assert [u.credits for u in await store.usage(limit=2)] == [99, 13]
    assert [u.credits for u in await store.usage(group="team", before_id=mine[1].id)] == [11, 10]
    assert await store.usage(group="nobody") == []
    by_model = await store.usage_by_model(key_id)
    totals = [(m.model, m.calls, m.prompt_tokens, m.credits) for m in by_model]
    assert totals == [("a/x", 3, 5, 35), ("a/y", 1, 1, 11)]
    window = await store.usage_by_model(key_id, since=1_001.5, until=1_002.5)
    assert [(m.model, m.calls) for m in window] == [("a/x", 1)]


async def test_concurrent_reservations_from_two_replicas_never_overspend(pg_url: str) -> None:
    url = pg_url
    """200 calls at once, half through each of two stores on one database, credit for 50 worst cases,
    some costing more than they reserved."""
    worst = 1_000_000
    initial = 50 * worst
    replicas = [open_store(url), open_store(url)]
    for s in replicas:
        await s.open()
    try:
        group_id, key_id = await team(replicas[0], initial)
        lowest = initial
        running = True

        async def watch() -> None:
            nonlocal lowest
            while running:
                lowest = min(lowest, (await ledger(replicas[1]))[0])
                await asyncio.sleep(0.005)

        async def call(n: int) -> int | None:
            s = replicas[n % 2]
            reservation = await s.reserve(group_id, key_id, worst)
            if isinstance(reservation, Refusal):
                return None
            await asyncio.sleep(0.001 * (n % 7))
            return await s.settle(reservation, usage(key_id, group_id, worst * (n % 3) // 2))  # 0, 50%, 100%

        watcher = asyncio.ensure_future(watch())
        charges = await asyncio.gather(*(call(n) for n in range(200)))
        running = False
        await watcher
        done = [c for c in charges if c is not None]
        balance, reserved, spent = await ledger(replicas[0])
        assert lowest >= 0 and balance >= 0 and reserved == 0
        assert balance + spent == initial and spent == sum(done)
        assert spent == sum(u.credits for u in await replicas[0].usage(group="team", limit=1_000))
        assert len(done) >= 50 and len(done) < 200  # the first 50 fit; the credit runs out
    finally:
        for s in replicas:
            await s.close()


async def test_many_groups_and_keys_across_two_replicas_stay_consistent(pg_url: str) -> None:
    url = pg_url
    """Calls on three groups (two keys each) through two stores, with top-ups and reconcile passes
    running meanwhile: no operation fails (no deadlock), and every group's ledger adds up."""
    replicas = [open_store(url), open_store(url)]
    for s in replicas:
        await s.open()
    try:
        teams = []
        for g in range(3):
            group_id, key_id = await team(replicas[0], 1_000_000, name=f"g{g}")
            other = await replicas[0].create_key(f"g{g}", "k2", secrets.token_hex(16), "h", spend_cap=400_000)
            teams.append((group_id, (key_id, other.id)))

        async def call(n: int) -> None:
            s = replicas[n % 2]
            group_id, keys = teams[n % 3]
            key_id = keys[(n // 3) % 2]
            reservation = await s.reserve(group_id, key_id, 10_000)
            if isinstance(reservation, Reservation):
                await asyncio.sleep(0.001 * (n % 5))
                await s.settle(reservation, usage(key_id, group_id, 2_000 + 4_000 * (n % 3)))  # <= the hold

        async def meanwhile(n: int) -> None:
            if n % 2:
                await replicas[n % 2].topup(f"g{n % 3}", 1_000)
            else:
                assert await replicas[n % 2].reconcile(older_than=3_600) == 0

        await asyncio.gather(*(call(n) for n in range(300)), *(meanwhile(n) for n in range(12)))
        for g in range(3):
            balance, reserved, spent = await ledger(replicas[1], f"g{g}")
            topups = 1_000 * sum(1 for n in range(12) if n % 2 and n % 3 == g)
            assert reserved == 0 and balance + spent == 1_000_000 + topups
            assert spent == sum(u.credits for u in await replicas[1].usage(group=f"g{g}", limit=1_000))
        assert all(k.spent <= 400_000 for k in await replicas[0].list_keys() if k.name == "k2")
    finally:
        for s in replicas:
            await s.close()


# -- PostgreSQL only --------------------------------------------------------------------------------------
async def test_operations_committed_together_match_one_by_one(pg_url: str) -> None:
    """Reservations, refusals, capped charges, a settlement repeated, a retry whose first try committed
    and an operation that fails, all in one batch (one ``ledger_batch`` statement, then one statement
    each once one fails), give what they give one at a time."""
    store = open_store(pg_url)
    await store.open()

    async def scenario(name: str, together: bool) -> tuple[list[Any], tuple[int, int, int], int, list[int]]:
        group_id, key_id = await team(store, 1_000, name=name, cap=1_100)
        first, second, third = [await store.reserve(group_id, key_id, n) for n in (300, 200, 50)]
        assert (
            isinstance(first, Reservation)
            and isinstance(second, Reservation)
            and isinstance(third, Reservation)
        )
        await store.settle(third, usage(key_id, group_id, 10))
        steps: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.settle(first, usage(key_id, group_id, 100)),
            lambda: store.reserve(group_id, key_id, 500),
            lambda: store.reserve(group_id, key_id, 400),  # over the key's cap
            lambda: store.reserve(group_id, key_id + 10_000, 1),  # no such key: fails, alone
            lambda: store.settle(second, usage(key_id, group_id, 5_000)),  # capped at what the group has
            lambda: store.reserve(group_id, key_id, 1),  # nothing left
            lambda: store.settle(first, usage(key_id, group_id, 50)),  # settled twice: nothing held
            lambda: store.settle_again(third, usage(key_id, group_id, 70)),  # committed already: skipped
            lambda: store.reserve(group_id, key_id, 0),
        ]
        if together:
            results = await asyncio.gather(*(step() for step in steps), return_exceptions=True)
        else:
            results = []
            for step in steps:
                try:
                    results.append(await step())
                except Exception as exc:  # (SQLite: the foreign key's IntegrityError)
                    results.append(exc)
        shown = [
            ("held", r.amount) if isinstance(r, Reservation) else "failed" if isinstance(r, Exception) else r
            for r in results
        ]
        [key] = await store.list_keys(name)
        return (
            shown,
            await ledger(store, name),
            key.spent,
            sorted(u.credits for u in await store.usage(group=name)),
        )

    try:
        together, alone = await scenario("together", True), await scenario("alone", False)
    finally:
        await store.close()
    assert together == alone
    shown, balance, key_spent, charges = together
    assert shown == [
        100,
        ("held", 500),
        Refusal("key_cap", 290, 400),
        "failed",
        390,
        Refusal("balance", 0, 1),
        0,
        70,
        ("held", 0),
    ]
    assert balance == (0, 500, 500) and key_spent == 500 and charges == [0, 10, 100, 390]


async def test_schema_version_and_constraints(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        async with store.db.connection() as conn:
            assert await conn.fetchval("SELECT version FROM schema_version") == len(MIGRATIONS)
            await conn.execute("INSERT INTO groups (name, balance, created_at) VALUES ('g', 5, 0)")
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE groups SET balance = balance - 6")
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE groups SET reserved = -1")
    finally:
        await store.close()


async def test_the_ledger_takes_a_new_connection_when_its_own_is_lost(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        group_id, key_id = await team(store, 1_000)
        first = await store.reserve(group_id, key_id, 100)
        assert isinstance(first, Reservation) and store.commits.conn is not None
        pid = store.commits.conn.get_server_pid()
        async with store.db.connection() as conn:
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        for _ in range(100):  # until the client has seen the connection close
            if not usable(store.commits.conn):
                break
            await asyncio.sleep(0.01)
        assert await store.settle(first, usage(key_id, group_id, 60)) == 60
        assert await ledger(store) == (940, 0, 60)
    finally:
        await store.close()


async def test_replicas_migrating_at_the_same_moment_take_turns(pg_url: str) -> None:
    conns = [await asyncpg.connect(pg_url) for _ in range(4)]
    try:
        await asyncio.gather(*(migrate(conn) for conn in conns))  # all at once, on an empty schema
        assert await conns[0].fetchval("SELECT version FROM schema_version") == len(MIGRATIONS)
        assert await conns[0].fetchval("SELECT count(*) FROM schema_version") == 1
    finally:
        for conn in conns:
            await conn.close()


async def test_two_replicas_reconciling_at_once_release_each_reservation_once(pg_url: str) -> None:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.open()
    await b.open()
    try:
        group_id, key_id = await team(a, 10**9)
        for _ in range(60):
            assert isinstance(await a.reserve(group_id, key_id, 1_000), Reservation)
        released = await asyncio.gather(a.reconcile(), b.reconcile(), a.reconcile(older_than=0))
        assert sum(released) == 60
        assert await ledger(a) == (10**9, 0, 0)
        assert len(await a.usage(group="team", limit=1_000)) == 60
    finally:
        await a.close()
        await b.close()


# -- gateway replicas (processes) on one PostgreSQL --------------------------------------------------------
class Emulators:
    """The emulated providers on a loop of their own in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="emulators", daemon=True)
        self.running: dict[str, Running] = {}

    def start(self) -> Emulators:
        self.thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_emulators(), self.loop).result(30)
        return self

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(stop_emulators(self.running), self.loop).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def emulators() -> Iterator[Emulators]:
    emus = Emulators().start()
    try:
        yield emus
    finally:
        emus.stop()


class Cluster:
    """Gateway processes (``router serve``) with one config; the operator's CLI on the same store."""

    def __init__(self, tmp: Path, url: str, emulators: Emulators) -> None:
        self.tmp = tmp
        self.url = url
        self.providers = {p: (r.base_url, r.api_key) for p, r in emulators.running.items()}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTER_")}

    def config(self, stale_seconds: float = 3_600.0) -> Path:
        lines = ["[store]", f"url = {json.dumps(self.url)}", f"stale_reservation_seconds = {stale_seconds}"]
        for prefix, (base_url, key) in sorted(self.providers.items()):
            lines += [f"[providers.{prefix}]", f"base_url = {json.dumps(base_url)}"]
            lines += [f"api_key = {json.dumps(key)}"]
        path = self.tmp / f"router-{stale_seconds:g}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def cli(self, *args: str) -> str:
        command = [sys.executable, "-m", "cli", "--config", str(self.config()), *args]
        out = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"router {' '.join(args)} failed: {out.stderr}"
        return out.stdout

    def group_key(self, name: str, credits: str) -> str:
        self.cli("groups", "create", name, "--credits", credits)
        return self.cli("keys", "create", "--group", name).strip().splitlines()[-1]

    def start(self, stale_seconds: float = 3_600.0) -> tuple[subprocess.Popen[bytes], str]:
        """A gateway on a free port, once it answers; returns the process and its /v1 base URL."""
        port = free_port()
        log = (self.tmp / f"gateway-{port}.log").open("wb")
        command = [
            sys.executable,
            "-m",
            "cli",
            "serve",
            "--config",
            str(self.config(stale_seconds)),
            "--port",
            str(port),
        ]
        proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        wait_healthy(port, proc, self.tmp / f"gateway-{port}.log")
        return proc, f"http://127.0.0.1:{port}/v1"

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def cluster(pg: Postgres, emulators: Emulators, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, pg.fresh_url(), emulators)
    try:
        yield c
    finally:
        c.stop_all()


async def group_state(url: str, name: str) -> tuple[int, int, int, list[UsageRecord]]:
    store = PostgresStore(url)
    await store.open()
    try:
        group = await store.get_group(name)
        assert group is not None
        return group.balance, group.reserved, group.spent, await store.usage(group=name, limit=10_000)
    finally:
        await store.close()


async def ask(client: openai.AsyncOpenAI, content: str, max_tokens: int) -> Any:
    return await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens
    )


async def test_two_gateways_share_one_ledger(cluster: Cluster) -> None:
    started = await asyncio.gather(asyncio.to_thread(cluster.start), asyncio.to_thread(cluster.start))
    bases = [base for _, base in started]
    content = "[slow:300] [tokens:2000] Tell me about credits."  # the same body for every call
    max_tokens = 1_000
    # the worst case of this body, observed: the group's reservation while a probe call is in flight
    probe_key = await asyncio.to_thread(cluster.group_key, "probe", "100")
    async with openai.AsyncOpenAI(base_url=bases[0], api_key=probe_key, max_retries=0, timeout=60) as probe:
        call = asyncio.ensure_future(ask(probe, content, max_tokens))
        worst = 0
        store = PostgresStore(cluster.url, max_size=1)
        await store.open()
        try:
            for _ in range(500):
                worst = (await ledger(store, "probe"))[1]
                if worst or call.done():
                    break
                await asyncio.sleep(0.005)
        finally:
            await store.close()
        await call
    assert worst > 0, "never saw the probe's reservation"
    initial = 50 * worst + worst // 2  # credit for 50 worst cases
    key = await asyncio.to_thread(cluster.group_key, "shared", f"{initial // 10**9}.{initial % 10**9:09d}")

    statuses: list[int] = []
    clients = [openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=60) for base in bases]
    try:

        async def one(n: int) -> None:
            try:
                await ask(clients[n % 2], content, max_tokens)
                statuses.append(200)
            except openai.APIStatusError as exc:
                statuses.append(exc.status_code)

        await asyncio.gather(*(one(n) for n in range(200)))
    finally:
        for client in clients:
            await client.close()

    ok, refused = statuses.count(200), statuses.count(402)
    assert ok + refused == 200, f"other statuses: {sorted(set(statuses) - {200, 402})}"
    balance, reserved, spent, records = await group_state(cluster.url, "shared")
    assert balance >= 0 and reserved == 0
    assert balance + spent == initial
    assert spent == sum(r.credits for r in records)
    assert len([r for r in records if r.status == "ok"]) == ok
    rejected = [r for r in records if r.status != "ok"]  # a flood of refusals is recorded as a sample
    assert {r.error_code for r in rejected} == {"insufficient_credits"}  # (gateway/refusals.py)
    noted = sum(
        int(r.error.split("(and ")[1].split(" ")[0]) for r in rejected if r.error and "(and " in r.error
    )
    assert min(refused, 10) <= len(rejected) and len(rejected) + noted <= refused
    # 50 worst cases fit at once; then the unused part of each hold comes back
    assert 50 <= ok < 60, (ok, refused, worst)


async def test_a_killed_gateway_leaves_a_hold_that_a_restart_releases(cluster: Cluster) -> None:
    proc, base = await asyncio.to_thread(cluster.start)
    key = await asyncio.to_thread(cluster.group_key, "killed", "10")
    initial = 10 * 10**9
    async with openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=30) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "[delay:200] [tokens:100] a slow one"}],
            max_tokens=200,
            stream=True,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass
        await stream.close()

    balance, reserved, spent, records = await group_state(cluster.url, "killed")
    assert reserved > 0 and balance + reserved == initial and spent == 0 and records == []

    await asyncio.to_thread(cluster.start, 0)  # stale_reservation_seconds = 0: everything left is a crash's
    balance, reserved, spent, records = await group_state(cluster.url, "killed")
    assert reserved == 0 and balance + spent == initial and balance == initial
    assert [(r.status, r.credits) for r in records] == [("interrupted", 0)]
    assert (
        records[0].model == MODEL and records[0].provider == "openai" and records[0].request_id
    )  # kept on the hold


def test_serve_with_two_workers_shares_one_port_and_one_ledger(
    pg: Postgres, stack: Stack, tmp_path: Path
) -> None:
    """``router serve --workers 2``: two processes accept on one socket, bill into one PostgreSQL
    ledger, and SIGTERM stops both cleanly."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.test_crash import _cli, _config_with_key, _serve

    config, key = _config_with_key(
        tmp_path, pg.fresh_url(), stack.emulators["openai"], "workers", 10, extra="[server]\nworkers = 2\n"
    )
    port = free_port()
    proc = _serve(config, port)
    try:
        deadline = time.monotonic() + 20  # the port accepts once bound: the workers are started just after
        while len(children := Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()) < 2:
            assert time.monotonic() < deadline, f"{len(children)} workers"
            time.sleep(0.05)
        assert len(children) == 2
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)

        def call(n: int) -> str:
            out = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"hi {n} [tokens:3]"}]
            )
            return out.choices[0].finish_reason or ""

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(call, range(40))) == ["stop"] * 40
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not any(
            Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
            for pid in children
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _cli(config, "usage", "--group", "workers", "--limit", "100").count(" ok ") == 40


def test_serve_with_workers_stopped_while_they_start_exits_cleanly(
    pg: Postgres, stack: Stack, tmp_path: Path
) -> None:
    """SIGTERM before the workers have their handlers in (they are still importing): they die of the
    forwarded signal with nothing in flight, and ``router serve`` reports a clean stop, not 241."""
    from tests.test_crash import _config_with_key, _serve

    config, _ = _config_with_key(
        tmp_path, pg.fresh_url(), stack.emulators["openai"], "early", 10, extra="[server]\nworkers = 2\n"
    )
    proc = _serve(config, free_port())  # the parent's socket accepts at once; the workers are starting
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
