"""Billing through the real path: every call reserved, settled exactly once, recorded (docs/operations.md, "Credits and billing")."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import openai
import pytest

from billing.pricing import cost, worst_case
from billing.store import UsageRecord
from core.catalog import NANO, Prices
from core.config import ReliabilitySettings, Settings, StoreSettings
from core.wire import ChatRequest, TokenUsage
from tests.conftest import Stack, break_off, http_post, older_hold


def test_cost_of_each_price_kind() -> None:
    prices = Prices(
        input=3 * NANO, output=15 * NANO, cached_input=NANO * 3 // 10, cache_write=NANO * 375 // 100
    )
    assert cost(prices, TokenUsage(prompt=1_000_000)) == 3 * NANO
    assert cost(prices, TokenUsage(completion=1_000_000)) == 15 * NANO
    assert cost(prices, TokenUsage(prompt=1_000_000, cached=1_000_000)) == 300_000_000
    assert cost(prices, TokenUsage(prompt=1_000_000, cache_write=1_000_000)) == 3_750_000_000
    # reasoning tokens are inside completion and billed as output, never twice
    assert cost(prices, TokenUsage(completion=10, reasoning=7)) == 150_000
    mixed = TokenUsage(prompt=1000, cached=200, cache_write=100, completion=50)
    assert (
        cost(prices, mixed)
        == (700 * 3 * NANO + 200 * 300_000_000 + 100 * 3_750_000_000 + 50 * 15 * NANO) // 10**6
    )
    # a sub-nano-credit remainder rounds up, once, at the end
    assert (
        cost(Prices(input=150_000_000, output=0, cached_input=0, cache_write=0), TokenUsage(prompt=1)) == 150
    )


def _group(stack: Stack, name: str):  # type: ignore[no-untyped-def]
    return stack.run(stack.store.get_group(name))


def _records(stack: Stack, group: str) -> list[UsageRecord]:
    return stack.run(stack.store.usage(group=group, limit=1000))


def _wait_records(stack: Stack, group: str, n: int) -> list[UsageRecord]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = _records(stack, group)
        if len(records) >= n:
            return records
        time.sleep(0.02)
    raise AssertionError(f"expected {n} usage records in {group}")


@pytest.mark.parametrize("stream", [False, True])
def test_exact_charge_and_usage_record(stack: Stack, stream: bool) -> None:
    group = stack.group(10)
    client = stack.client(stack.key(group=group))
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": "count [tokens:20]"}],
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    usage = list(out)[-1].usage if stream else out.usage  # type: ignore[union-attr, arg-type]
    [record] = _wait_records(stack, group, 1)
    assert (record.prompt_tokens, record.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    expected = -(-(usage.prompt_tokens * 150_000_000 + usage.completion_tokens * 600_000_000) // 10**6)
    assert record.credits == expected
    assert record.status == "ok" and record.usage_exact and record.stream is stream
    assert record.model == "openai/gpt-4o-mini" and record.provider == "openai" and record.source == "api"
    assert record.latency_ms > 0 and (record.ttft_ms is not None) is stream
    assert record.upstream_request_id and record.request_id
    g = _group(stack, group)
    assert g.balance == 10 * NANO - expected and g.spent == expected and g.reserved == 0


def test_402_before_any_upstream_call(stack: Stack) -> None:
    group = stack.group(0.0001)
    emulator = stack.emulator("openai")
    before = len(emulator.requests)
    with pytest.raises(openai.APIStatusError) as info:
        stack.client(stack.key(group=group)).chat.completions.create(
            model="openai/gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
        )
    assert info.value.status_code == 402
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "insufficient_credits"
    assert "0.0001" in info.value.message and "needs up to" in info.value.message
    assert len(emulator.requests) == before
    assert [(r.status, r.credits, r.error_code, r.model) for r in _records(stack, group)] == [
        ("rejected", 0, "insufficient_credits", "openai/gpt-4o")
    ]  # recorded, not charged
    assert _group(stack, group).balance == 100_000


def test_upstream_500_costs_nothing(stack: Stack) -> None:
    group = stack.group(1)
    client = stack.client(stack.key(group=group))
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError):
            out = client.chat.completions.create(
                model="mistral/mistral-small-latest",
                messages=[{"role": "user", "content": "[fault:500]"}],
                stream=stream,
            )
            if stream:
                list(out)  # type: ignore[arg-type]
    records = _wait_records(stack, group, 2)
    assert all(r.status == "error" and r.credits == 0 for r in records)
    g = _group(stack, group)
    assert g.balance == NANO and g.spent == 0 and g.reserved == 0


def test_stream_broken_off_by_the_client_is_billed(stack: Stack) -> None:
    group = stack.group(1)
    key = stack.key(group=group)
    body = json.dumps(
        {
            "model": "openai/gpt-4o-mini",
            "stream": True,
            "max_tokens": 400,
            "messages": [{"role": "user", "content": "long [tokens:300] [delay:20]"}],
        }
    ).encode()
    break_off(stack.port, http_post(key, body), b"data: ", 12)
    [record] = _wait_records(stack, group, 1)
    assert record.status == "interrupted" and not record.usage_exact
    assert 10 <= record.completion_tokens < 300  # what was generated, not the whole answer
    assert record.prompt_tokens > 0 and record.credits > 0
    g = _group(stack, group)
    assert g.reserved == 0 and g.spent == record.credits and g.balance + g.spent == NANO


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{n}",
            "description": f"Look up record kind {n} by id.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string", "description": "the id"}},
            },
        },
    }
    for n in range(20)
]


def _break_off(stack: Stack, key: str, call: dict[str, object], events: int = 12) -> None:
    break_off(stack.port, http_post(key, json.dumps({**call, "stream": True}).encode()), b"data: ", events)


@pytest.mark.parametrize(
    "model", ["anthropic/claude-haiku-4-5", "openai/gpt-4o-mini", "mistral/mistral-small-latest"]
)
def test_stream_broken_off_bills_the_whole_prompt(stack: Stack, model: str) -> None:
    """A stream the caller breaks off is billed its whole prompt, tool definitions included: the
    upstream's exact count when it gave one before the end (Anthropic's message_start), else an
    estimate that counts the tools too (it counted only the messages: 17 tokens for a 3,700-token
    prompt)."""
    call = {
        "model": model,
        "tools": TOOLS,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "long [tokens:300] [delay:20]"}],
    }
    whole = stack.client(stack.key(group=stack.group(1))).chat.completions.create(**call)  # type: ignore[arg-type]
    group = stack.group(1)
    _break_off(stack, stack.key(group=group), call)
    [record] = _wait_records(stack, group, 1)
    assert record.status == "interrupted" and not record.usage_exact
    assert 5 <= record.completion_tokens < 300
    exact = whole.usage.prompt_tokens  # type: ignore[union-attr]
    if model.startswith("anthropic/"):
        assert record.prompt_tokens == exact
    else:
        # an estimate (cl100k); the emulators count a word or a punctuation mark as a token, which
        # counts JSON (the tool definitions) about 1.8x: within half to 1.5x of theirs
        assert 0.5 * exact <= record.prompt_tokens <= 1.5 * exact, (record.prompt_tokens, exact)


def test_concurrent_calls_never_overspend(stack: Stack) -> None:
    request = ChatRequest(model="openai/gpt-4o", messages=[], max_tokens=100)  # type: ignore[arg-type]
    model = stack.gateway.catalog.resolve("openai/gpt-4o")
    body = json.dumps(
        {
            "model": "openai/gpt-4o",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hello [tokens:5]"}],
        }
    ).encode()
    worst = worst_case(model, len(body) + 40, request)
    group = stack.group(0)
    stack.run(stack.store.topup(group, worst * 50))
    key = stack.key(group=group)

    async def one(client: openai.AsyncOpenAI) -> str:
        try:
            await client.chat.completions.create(
                model="openai/gpt-4o",
                max_tokens=100,
                messages=[{"role": "user", "content": "hello [tokens:5]"}],
            )
            return "ok"
        except openai.APIStatusError as exc:  # too few credits, or past its share of the calls in flight
            assert exc.status_code == 402 or exc.code == "concurrency_limit_exceeded"  # type: ignore[attr-defined]
            return str(exc.status_code)

    async def burst() -> list[str]:
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
        try:
            return await asyncio.gather(*(one(client) for _ in range(200)))
        finally:
            await client.close()

    results = asyncio.run(burst())
    assert results.count("ok") >= 50  # each call costs far less than its worst case
    g = _group(stack, group)
    assert g.balance >= 0 and g.reserved == 0
    records = _wait_records(stack, group, results.count("ok"))
    assert g.spent == sum(r.credits for r in records)
    assert g.balance + g.spent == worst * 50


def test_key_allow_list_and_spend_cap(stack: Stack) -> None:
    group = stack.group(100)
    limited = stack.client(stack.key(group=group, models=["openai/gpt-4o-mini"]))
    assert limited.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    with pytest.raises(openai.PermissionDeniedError) as info:
        limited.chat.completions.create(model="openai/gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_allowed"  # type: ignore[attr-defined]
    capped = stack.client(stack.key(group=group, spend_cap=NANO // 1000))
    with pytest.raises(openai.APIStatusError) as info2:
        capped.chat.completions.create(
            model="openai/gpt-4o", messages=[{"role": "user", "content": "x"}], max_tokens=5000
        )
    assert info2.value.status_code == 402 and info2.value.code == "key_spend_cap_reached"  # type: ignore[attr-defined]
    assert capped.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}], max_tokens=10
    )


def test_settlements_committed_together_match_one_by_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SQLite group commit applies a batch of settlements at once (one balance read per group,
    one update per group and key, one insert); the outcome must be what settling them one by one
    gives: charges capped by what is left, stored reservations released, and one bad settlement
    failing alone."""
    from billing.sqlite import SQLiteStore
    from billing.store import Reservation

    def record(group_id: int, key_id: int, credits: int) -> UsageRecord:
        return UsageRecord(
            key_id=key_id,
            group_id=group_id,
            model="m",
            provider="p",
            endpoint="chat",
            source="api",
            stream=False,
            credits=credits,
        )

    async def main() -> None:
        store = SQLiteStore(f"sqlite:///{tmp_path / 'r.db'}")
        await store.open()
        try:
            a = await store.create_group("a", 1000)
            b = await store.create_group("b", 50)
            ka = await store.create_key("a", "ka", "h" * 64, "hint")
            kb = await store.create_key("b", "kb", "g" * 64, "hint")
            held = await older_hold(
                store, a.id, ka.id, 300
            )  # a stored reservation: balance 700, reserved 300
            assert isinstance(held, Reservation)
            memory = Reservation(-1, a.id, ka.id, 0)  # admission held in the gateway's memory
            statements: list[str] = []
            assert store._here is not None  # group commits run on the event loop's connection
            store._here.set_trace_callback(statements.append)
            jobs = [
                (held, record(a.id, ka.id, 250)),  # releases 300, charges 250 -> balance 750
                (memory, record(a.id, ka.id, 500)),  # 250 left
                (memory, record(a.id, ka.id, 400)),  # only 250 left: charged 250
                (Reservation(-3, b.id, kb.id, 0), record(b.id, kb.id, 30)),
                (memory, record(a.id, ka.id, 0)),  # free: a record, no charge
                (held, record(a.id, ka.id, 10)),  # settled twice: nothing held any more, 0 left
            ]
            batches = store.commits.batches
            results = await asyncio.gather(*[store.settle_soon(r, rec) for r, rec in jobs])  # one batch
            assert results == [250, 500, 250, 30, 0, 0]
            assert store.commits.batches == batches + 1
            assert sum(s.startswith("SELECT id, balance, ") for s in statements) == 1  # applied together
            statements.clear()
            jobs = [
                (Reservation(-3, b.id, kb.id, 0), record(b.id, kb.id, 15)),
                (Reservation(-2, 999, ka.id, 0), record(999, ka.id, 5)),  # no such group: fails alone
                (Reservation(-3, b.id, kb.id, 0), record(b.id, kb.id, 15)),  # 5 left
            ]
            results = await asyncio.gather(
                *[store.settle_soon(r, rec) for r, rec in jobs], return_exceptions=True
            )
            assert results[0] == 15 and results[2] == 5 and isinstance(results[1], Exception)
            assert sum(s.startswith("SAVEPOINT op") for s in statements) == 3  # then one by one
            store._here.set_trace_callback(None)
            ga, gb = await store.get_group("a"), await store.get_group("b")
            assert ga is not None and gb is not None
            assert (ga.balance, ga.reserved, ga.spent) == (0, 0, 1000)
            assert (gb.balance, gb.reserved, gb.spent) == (0, 0, 50)
            keys = {k.name: k for k in await store.list_keys()}
            assert keys["ka"].spent == 1000 and keys["kb"].spent == 50
            rows = await store.usage(limit=100)
            assert sorted(r.credits for r in rows) == sorted([250, 500, 250, 30, 0, 0, 15, 5])
        finally:
            await store.close()

    asyncio.run(main())


def test_a_lingering_batch_waits_for_a_quiet_moment_and_no_longer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A settlement nobody waits for lingers to be batched with others, then waits for the moment a
    call goes to its upstream (Store.upstream_wait) to be written, and no longer than ``quiet_wait``
    when none comes; a settlement somebody waits for starts the batch at once."""
    from billing.sqlite import SQLiteStore
    from billing.store import Reservation

    async def main() -> None:
        store = SQLiteStore(f"sqlite:///{tmp_path / 'r.db'}")
        await store.open()
        try:
            g = await store.create_group("g", 1000)
            k = await store.create_key("g", "k", "h" * 64, "hint")
            held = Reservation(-1, g.id, k.id, 0)

            def settle(credits: int, linger: bool = True) -> asyncio.Future[int]:
                record = UsageRecord(
                    key_id=k.id,
                    group_id=g.id,
                    model="m",
                    provider="p",
                    endpoint="chat",
                    source="api",
                    stream=False,
                    credits=credits,
                )
                return store.settle_soon(held, record, linger)

            store.commits.quiet_wait = 60.0  # (the test would time out waiting for it)
            store.upstream_wait()  # no batch waiting: nothing happens
            first = settle(10)
            await asyncio.sleep(0.2)  # lingered (20 ms), now waiting for a quiet moment
            assert not first.done()
            store.upstream_wait()
            assert await asyncio.wait_for(first, 5) == 10
            second = settle(20)
            await asyncio.sleep(0.2)
            assert not second.done()
            assert await asyncio.wait_for(asyncio.gather(second, settle(30, linger=False)), 5) == [20, 30]
            store.commits.quiet_wait = 0.05  # no quiet moment comes: written after the wait
            assert await asyncio.wait_for(settle(40), 5) == 40
            group = await store.get_group("g")
            assert group is not None and (group.spent, group.balance) == (100, 900)
        finally:
            await store.close()

    asyncio.run(main())


def test_a_call_going_to_its_upstream_writes_the_lingering_settlements(tmp_path: Path) -> None:
    """On the call path, with replies that do not wait for their charge (``reply_wait_seconds = 0``): a
    call's settlement lingers, then is written when the next call goes to its upstream (long before
    ``quiet_wait`` would have run out)."""
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/r.db", reply_wait_seconds=0),
        reliability=ReliabilitySettings(max_retries=0),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        stack.gateway.store.commits.quiet_wait = 60.0
        client = stack.client()
        ask = {
            "model": "openai/gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        client.chat.completions.create(**ask)
        time.sleep(0.2)  # its settlement has lingered and waits for a quiet moment
        first = list(stack.gateway.ledger.pending)
        assert len(first) == 1 and not first[0].done()
        client.chat.completions.create(**ask)  # goes to its upstream: the first settlement is written
        deadline = time.monotonic() + 5
        while not first[0].done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first[0].done() and first[0].result() > 0
    finally:
        stack.gateway.store.commits.quiet_wait = 0.01
        stack.loop.call_soon_threadsafe(stack.gateway.store.upstream_wait)  # a batch still waiting goes
        stack.close_clients()
        stack.stop()


def test_group_commit_never_blocks_the_event_loop_on_a_locked_database(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Group commits run on the event loop's connection, which never waits for a lock: while another
    process holds the write lock (the CLI, say), the batch goes to the store's thread, which waits,
    and the loop keeps running; the settlement lands once the lock is free."""
    import sqlite3

    from billing.sqlite import SQLiteStore
    from billing.store import Reservation

    async def main() -> None:
        path = tmp_path / "r.db"
        store = SQLiteStore(f"sqlite:///{path}")
        await store.open()
        try:
            g = await store.create_group("g", 1000)
            k = await store.create_key("g", "k", "h" * 64, "hint")
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            record = UsageRecord(
                key_id=k.id,
                group_id=g.id,
                model="m",
                provider="p",
                endpoint="chat",
                source="api",
                stream=False,
                credits=70,
            )
            settling = store.settle_soon(Reservation(-1, g.id, k.id, 0), record)
            ticks = 0
            began = time.monotonic()
            while time.monotonic() - began < 0.3:  # the loop keeps turning while the lock is held
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks >= 15 and not settling.done()
            other.execute("COMMIT")
            other.close()
            assert await asyncio.wait_for(settling, 5) == 70
            group = await store.get_group("g")
            assert group is not None and group.spent == 70 and group.balance == 930
        finally:
            await store.close()

    asyncio.run(main())


async def test_a_settlement_that_cannot_be_stored_is_logged_with_its_usage_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Answers do not wait for their settlement; if the store then fails it, the charge is lost, so
    the log must say which call it was (its usage record), and drain() still returns."""
    from billing.ledger import Ledger
    from billing.store import Reservation

    class BrokenStore:
        owes = False

        def settle_soon(
            self, reservation: Reservation, record: UsageRecord, linger: bool, owed: bool = False
        ) -> asyncio.Future[int]:
            failed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("disk full"))
            return failed

    ledger = Ledger(BrokenStore())  # type: ignore[arg-type]
    record = UsageRecord(
        key_id=7,
        group_id=3,
        model="openai/gpt-4o-mini",
        provider="openai",
        credits=1234,
        request_id="req_lost",
    )
    with caplog.at_level("ERROR", logger="router.ledger"):
        ledger.queue(Reservation(1, 3, 7, 5000), record)
        await ledger.drain()
    assert not ledger.pending
    [line] = [r.getMessage() for r in caplog.records if r.name == "router.ledger"]
    assert "disk full" in line and "req_lost" in line and "credits=1234" in line


def test_reservation_covers_the_output_cap_the_adapter_raised(stack: Stack) -> None:
    """``reasoning_effort`` without ``max_tokens``: the Anthropic adapter raises ``max_tokens`` to make
    room to think (4,096 → 20,480), so the reservation must cover that, not the default cap: a group
    that can pay for 4,096 output tokens but not for the answer is refused before anything is sent
    (it was charged only what it had, and the gateway paid the rest), and one that can pay is charged
    the whole cost."""
    call = {
        "model": "anthropic/claude-haiku-4-5",
        "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "think long [tokens:8000]"}],
    }
    emulator = stack.emulator("anthropic")
    poor = stack.group(0.03)  # 4,096 output tokens cost 0.0205; 8,000 cost 0.04
    before = len(emulator.requests)
    with pytest.raises(openai.APIStatusError) as info:
        stack.client(stack.key(group=poor)).chat.completions.create(**call)  # type: ignore[call-overload]
    assert info.value.status_code == 402 and len(emulator.requests) == before
    assert _group(stack, poor).balance == 30_000_000
    assert [(r.status, r.credits) for r in _records(stack, poor)] == [("rejected", 0)]

    rich = stack.group(1)
    out = stack.client(stack.key(group=rich)).chat.completions.create(**call)  # type: ignore[call-overload]
    assert out.usage.completion_tokens >= 8000
    [record] = _wait_records(stack, rich, 1)
    model = stack.gateway.catalog.resolve("anthropic/claude-haiku-4-5")
    usage = TokenUsage(prompt=out.usage.prompt_tokens, completion=out.usage.completion_tokens)
    assert record.credits == cost(model.prices, usage) > 30_000_000
    assert _group(stack, rich).balance == NANO - record.credits


def test_reservations_an_older_version_left_in_sqlite_are_released_at_the_start(tmp_path: Path) -> None:
    """Versions that reserved in the SQLite store left rows when they crashed; this one holds reservations in
    memory, and releases such rows when the gateway starts (``serve``), each with an ``interrupted``
    record and no charge."""
    from billing.sqlite import SQLiteStore
    from core.config import StoreSettings

    async def main() -> None:
        url = f"sqlite:///{tmp_path / 'old.db'}"
        store = SQLiteStore(url)
        await store.open()
        group = await store.create_group("g", 10_000)
        key = await store.create_key("g", "k", "h" * 64, "hint")
        for amount in (1_000, 2_000):
            await older_hold(store, group.id, key.id, amount)
        g = await store.get_group("g")
        assert g is not None and (g.balance, g.reserved) == (7_000, 3_000)
        await store.close()
        store = SQLiteStore(url)
        await store.open()
        try:
            await store.serve(StoreSettings(url=url))
            g = await store.get_group("g")
            assert g is not None and (g.balance, g.reserved, g.spent) == (10_000, 0, 0)
            records = await store.usage(group="g")
            assert [(r.status, r.credits) for r in records] == [("interrupted", 0), ("interrupted", 0)]
            assert await store.reconcile() == 0
        finally:
            await store.close()

    asyncio.run(main())
