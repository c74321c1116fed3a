"""core.flights: concurrent callers share a read that started after they asked. Its rules on their
own, then through the gateway: a burst of calls with a cold key cache is one key lookup, and a flood
of calls refused for want of credit is a few balance reads, not one (or two) per call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from core.flights import Flights
from tests.conftest import Stack


class Reads:
    """A read whose every run waits to be let go, numbered in the order they started."""

    def __init__(self) -> None:
        self.started = 0
        self.gates: list[asyncio.Event] = []

    async def __call__(self) -> int:
        self.started += 1
        number = self.started
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return number


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_callers_share_the_next_read_never_one_already_running() -> None:
    flights: Flights[int] = Flights()
    read = Reads()
    a = asyncio.ensure_future(flights.fresh("k", read))
    await turns()
    assert read.started == 1  # a's read runs
    b = asyncio.ensure_future(flights.fresh("k", read))
    c = asyncio.ensure_future(flights.fresh("k", read))
    other = asyncio.ensure_future(flights.fresh("other key", read))
    await turns()
    assert read.started == 2  # b and c asked after read 1 began: they wait for the next; "other" has its own
    read.gates[0].set()
    assert await a == 1
    await turns()
    assert read.started == 3  # read 1 over: b's and c's starts
    d = asyncio.ensure_future(flights.fresh("k", read))  # asks while that one runs
    read.gates[1].set()
    read.gates[2].set()
    assert (await b, await c, await other) == (3, 3, 2)
    await turns()
    read.gates[3].set()
    assert await d == 4
    assert read.started == 4


async def test_a_failed_read_fails_everyone_sharing_it_and_the_next_one_reads_again() -> None:
    flights: Flights[int] = Flights()
    calls = 0
    gate = asyncio.Event()

    async def failing() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        raise ConnectionError("store down")

    waiting = [asyncio.ensure_future(flights.fresh("k", failing)) for _ in range(3)]
    await turns()
    gate.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError] * 3
    assert calls == 1

    async def working() -> int:
        return 7

    assert await flights.fresh("k", working) == 7


async def test_a_cancelled_caller_leaves_the_read_to_the_others() -> None:
    flights: Flights[int] = Flights()
    read = Reads()
    first = asyncio.ensure_future(flights.fresh("k", read))
    second = asyncio.ensure_future(flights.fresh("k", read))
    await turns()
    first.cancel()
    await turns()
    read.gates[0].set()
    assert await second == 1
    assert first.cancelled()


# -- through the gateway ---------------------------------------------------------------------------


def held(stack: Stack, monkeypatch: pytest.MonkeyPatch, method: str) -> tuple[list[int], Any]:
    """The gateway's store ``method`` counted, its first call held until ``release()``."""
    store = stack.gateway.store
    original = getattr(store, method)
    calls: list[int] = []
    gate = stack.run(_event())

    async def counted(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            await gate.wait()
        return await original(*args)

    monkeypatch.setattr(store, method, counted)
    return calls, lambda: stack.loop.call_soon_threadsafe(gate.set)


async def _event() -> asyncio.Event:
    return asyncio.Event()


def arrivals(stack: Stack, monkeypatch: pytest.MonkeyPatch, obj: Any, method: str) -> list[int]:
    """Calls that reached ``obj.method`` (on the gateway's loop)."""
    original = getattr(obj, method)
    seen: list[int] = []

    async def counted(*args: Any, **kw: Any) -> Any:
        seen.append(1)
        return await original(*args, **kw)

    monkeypatch.setattr(obj, method, counted)
    return seen


def wait_for(seen: list[int], n: int) -> None:
    deadline = time.monotonic() + 20
    while len(seen) < n:
        assert time.monotonic() < deadline, f"{len(seen)} of {n} calls arrived"
        time.sleep(0.01)


CALLS = 40


def burst(stack: Stack, key: str, n: int) -> concurrent.futures.Future[list[Any]]:
    """``n`` concurrent chat calls with ``key``, from a thread of their own (the OpenAI SDK's client)."""

    async def many() -> list[Any]:
        async with stack.async_client(key) as client:
            return await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
                    )
                    for _ in range(n)
                ),
                return_exceptions=True,
            )

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(asyncio.run, many())
    finally:
        pool.shutdown(wait=False)


def test_a_burst_with_a_cold_key_cache_is_one_lookup(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    key = stack.key(100)
    lookups, release = held(stack, monkeypatch, "principal")
    entered = arrivals(stack, monkeypatch, stack.gateway.auth, "authenticate")
    calls = burst(stack, key, CALLS)
    wait_for(entered, CALLS)  # every call waits for the key's lookup
    release()
    answers = calls.result(60)
    assert all(isinstance(a, ChatCompletion) for a in answers), answers
    # the one held, and the one every other call shared (one, if all asked before it started; before
    # core/flights.py: one a call)
    assert 1 <= len(lookups) <= 2, len(lookups)


def test_a_flood_of_refused_calls_reads_the_balance_a_few_times(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = stack.key(0)
    with (
        stack.client(key) as client,
        pytest.raises(openai.APIStatusError) as refused,
    ):  # the key's lookup cached
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.status_code == 402
    reads, release = held(stack, monkeypatch, "ledger_state")
    entered = arrivals(stack, monkeypatch, stack.gateway.ledger, "reserve")
    calls = burst(stack, key, CALLS)
    wait_for(entered, CALLS)
    release()
    answers = calls.result(60)
    assert [getattr(a, "status_code", a) for a in answers] == [402] * CALLS
    # each refusal reads again (a top-up is seen at once), sharing the read that starts after it asked:
    # the held one (every call when all asked before it started), the one the others shared, and a few
    # more as the refusals came (before: 40 to 80)
    assert 1 <= len(reads) <= 6, len(reads)
