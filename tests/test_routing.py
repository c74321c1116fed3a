"""Routing strategies (pure: deployments, loads and a seeded random source in, an order out) and the
deployment state they read, in memory and in Redis (the shared one on 127.0.0.1:6379, under a
prefix of each test's own)."""

from __future__ import annotations

import asyncio
import math
import random
import secrets
from collections import Counter

import pytest

from core.deployments import Deployment
from gateway import routing
from gateway.routing import Load
from gateway.upstream_state import Lease, MemoryState
from tests.conftest import REDIS_URL


def dep(name: str, weight: float = 1.0, rpm: int = 0, tpm: int = 0) -> Deployment:
    """A deployment of a provider group of these tests' own: its leases move the process's
    router_deployment_in_flight gauge, which a gateway's openai/ deployments must not share."""
    return Deployment(
        "routing-unit", f"http://{name}.test/v1", "k", name=name, weight=weight, rpm=rpm, tpm=tpm
    )


A, B, C = dep("a", 1), dep("b", 2), dep("c", 5)


def firsts(
    strategy: str, deps: list[Deployment], loads: list[Load], n: int, seed: int = 7, **kw: float
) -> Counter[str]:
    rnd = random.Random(seed)
    return Counter(deps[routing.order(strategy, deps, loads, rnd, **kw)[0]].name for _ in range(n))  # type: ignore[arg-type]


def within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_simple_shuffle_is_weighted_random() -> None:
    n = 20_000
    counts = firsts("simple-shuffle", [A, B, C], [Load()] * 3, n)
    assert within(counts["a"], n, 1 / 8) and within(counts["b"], n, 2 / 8) and within(counts["c"], n, 5 / 8)
    order = routing.order("simple-shuffle", [A, B, C], [Load()] * 3, random.Random(1))
    assert sorted(order) == [
        0,
        1,
        2,
    ]  # every deployment is in the order: the others are where a call moves to


def test_least_busy_latency_and_usage_rank_by_their_measure() -> None:
    busy = [Load(in_flight=4), Load(in_flight=1), Load(in_flight=9)]
    assert firsts("least-busy", [A, B, C], busy, 200) == {"b": 200}
    assert routing.order("least-busy", [A, B, C], busy, random.Random(2)) == [1, 0, 2]
    slow = [Load(latency=0.5), Load(latency=0.05), Load(latency=0.2)]
    assert firsts("latency", [A, B, C], slow, 200, exploration=0.0) == {"b": 200}
    unmeasured = [Load(latency=0.5), Load(latency=0.05), Load()]  # measured first, so it gets measured
    assert firsts("latency", [A, B, C], unmeasured, 200, exploration=0.0) == {"c": 200}
    # a non-stream call ranks by seconds per output token, its own kind's measure
    both = [
        Load(latency=0.5, per_token=0.01),
        Load(latency=0.05, per_token=0.04),
        Load(latency=0.2, per_token=0.02),
    ]
    assert firsts("latency", [A, B, C], both, 200, exploration=0.0, stream=False) == {"a": 200}
    assert firsts("latency", [A, B, C], both, 200, exploration=0.0) == {"b": 200}
    explored = firsts("latency", [A, B, C], slow, 10_000, exploration=0.2)
    # 80 % to the fastest, the 20 % explored weighted at random (b's share of those: 2/8)
    assert within(explored["b"], 10_000, 0.8 + 0.2 * 2 / 8) and within(explored["a"], 10_000, 0.2 / 8)
    room = [Load(headroom=0.1), Load(headroom=0.9), Load(headroom=0.3)]
    assert routing.order("usage", [A, B, C], room, random.Random(3)) == [1, 2, 0]


def test_ties_are_broken_by_weight() -> None:
    n = 20_000
    counts = firsts("least-busy", [A, B, C], [Load(in_flight=1)] * 3, n)
    assert within(counts["c"], n, 5 / 8) and within(counts["a"], n, 1 / 8)


def test_a_conversation_is_named_by_its_key_and_first_messages_or_its_user() -> None:
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    names = set()
    for turn in range(10):  # the conversation grows; its first two messages do not change
        turns += [
            {"role": "assistant", "content": f"answer {turn}"},
            {"role": "user", "content": f"more {turn}"},
        ]
        names.add(routing.conversation(7, {"messages": list(turns)}, 2))
    assert len(names) == 1
    assert routing.conversation(8, {"messages": turns}, 2) not in names  # another key, another conversation
    assert (
        routing.conversation(7, {"messages": turns[:1] + [{"role": "user", "content": "Hi"}]}, 2) not in names
    )
    by_user = routing.conversation(7, {"messages": turns, "user": "u-1"}, 2)
    assert by_user == routing.conversation(
        7, {"messages": [{"role": "user", "content": "x"}], "user": "u-1"}, 2
    )
    assert routing.conversation(7, {"input": "Hello"}, 2) == routing.conversation(7, {"input": "Hello"}, 2)


def test_sticky_order_is_stable_weighted_and_moves_only_a_lost_deployments_conversations() -> None:
    deps = [A, B, C]
    digests = [secrets.token_bytes(16) for _ in range(8_000)]
    orders = [routing.sticky(d, deps) for d in digests]
    assert orders == [routing.sticky(d, deps) for d in digests]  # the same on every call, every replica
    counts = Counter(deps[o[0]].name for o in orders)
    assert within(counts["a"], 8_000, 1 / 8) and within(counts["c"], 8_000, 5 / 8)
    without_c = [A, B]  # c gone (cooling): its conversations move, the others stay where they were
    for digest, order in zip(digests, orders, strict=True):
        first = deps[order[0]].name
        moved = without_c[routing.sticky(digest, without_c)[0]].name
        assert moved == first if first != "c" else moved == deps[order[1]].name


M = "openai/gpt-4o-mini"


def test_memory_state_skips_resting_deployments_and_full_ceilings() -> None:
    now = [1000.0]
    state = MemoryState(alpha=0.5, clock=lambda: now[0])
    limited = dep("l", rpm=2)
    first = state.acquire_now([A, B], M, 0)
    assert isinstance(first, Lease) and first.deployment is A and state.load(A, M).in_flight == 1
    state.release(first, cooldown=10.0)
    state.release(first, cooldown=99.0)  # idempotent
    assert state.load(A, M).in_flight == 0 and state.resting(A) == {M: 10.0}
    second = state.acquire_now([A, B], M, 0)
    assert isinstance(second, Lease) and second.deployment is B  # A rests for this model
    other = state.acquire_now([A, B], "openai/gpt-4o", 0)
    assert (
        isinstance(other, Lease) and other.deployment is A
    )  # not for another (providers limit models apart)
    assert state.acquire_now([A], M, 0) == 10.0  # nothing can take it: how long until one could
    now[0] += 10.0
    assert isinstance(state.acquire_now([A], M, 0), Lease) and state.resting(A) == {}
    takes = [state.acquire_now([limited], M, 0) for _ in range(3)]  # a bucket of 2 a minute
    assert [isinstance(t, Lease) for t in takes] == [True, True, False] and takes[2] == pytest.approx(30.0)
    assert state.load(limited, M).headroom == 0.0 and state.load(A, M).headroom == 1.0
    assert state.acquire_now([dep("t", tpm=100)], M, 101) == math.inf  # more than the ceiling itself
    for sample in (0.2, 0.4):
        lease = state.acquire_now([B], M, 0)
        assert isinstance(lease, Lease)
        state.release(lease, latency=sample)
    assert state.load(B, M).latency == pytest.approx(0.3)  # a moving average, per model
    assert state.load(B, "openai/gpt-4o").latency is None
    for seconds, output in ((0.4, 200), (0.6, 100)):  # non-stream calls: into the other average
        lease = state.acquire_now([B], M, 0)
        assert isinstance(lease, Lease)
        lease.latency, lease.stream, lease.output = seconds, False, output
        lease.end()
    assert state.load(B, M).per_token == pytest.approx(0.004)  # 0.002 and 0.006 seconds a token, alpha 0.5
    assert state.load(B, M).latency == pytest.approx(0.3)  # streams' time to first byte: untouched
    lease = state.acquire_now([B], M, 0)
    assert isinstance(lease, Lease)
    lease.latency, lease.stream = 5.0, False  # its output never known (the body broke off): no sample
    lease.end()
    assert state.load(B, M).per_token == pytest.approx(0.004)


async def _redis_state(prefix: str, url: str = REDIS_URL):  # type: ignore[no-untyped-def]
    from gateway.upstream_state_redis import RedisState

    return RedisState(url, prefix, timeout=1.0, alpha=0.5)


def test_redis_state_is_shared_by_replicas() -> None:
    async def scenario() -> None:
        prefix = f"test:dep:{secrets.token_hex(4)}"
        one, two = await _redis_state(prefix), await _redis_state(prefix)
        limited = dep("l", rpm=3)
        try:
            held = [await s.acquire([limited], M, 0) for s in (one, two, one)]
            assert all(isinstance(h, Lease) for h in held)
            refused = await two.acquire([limited], M, 0)  # the fourth call this minute, on either replica
            assert refused == pytest.approx(20.0, abs=0.5)
            lease = await one.acquire([A, B], M, 0)
            assert isinstance(lease, Lease) and lease.deployment is A
            assert two.load(A, M).in_flight == 0  # two has not asked yet
            other = await two.acquire([A, B], M, 0)
            assert isinstance(other, Lease) and two.load(A, M).in_flight == 2  # its own and one's call
            one.release(lease, cooldown=30.0)  # A answered 429: it rests, for every replica
            two.release(other, latency=0.25, per_token=0.002)
            await asyncio.sleep(0.05)  # releases go with the next round trip, or on their own
            moved = await two.acquire([A, B], M, 0)
            assert isinstance(moved, Lease) and moved.deployment is B
            assert two.resting(A)[M] == pytest.approx(30.0, abs=1.0) and two.load(
                A, M
            ).latency == pytest.approx(0.25)
            assert two.load(A, M).per_token == pytest.approx(0.002) and two.load(B, M).per_token is None
            assert two.load(A, M).in_flight == 0
            elsewhere = await two.acquire([A, B], "openai/gpt-4o", 0)
            assert isinstance(elsewhere, Lease) and elsewhere.deployment is A  # the rest is for one model
            assert await one.acquire([dep("t", tpm=100)], M, 101) == math.inf
        finally:
            await one.close()
            await two.close()

    asyncio.run(scenario())


def test_redis_out_of_reach_routes_on_the_process_own_state() -> None:
    async def scenario() -> None:
        state = await _redis_state("test:dep:down", "redis://127.0.0.1:1/0")
        try:
            lease = await state.acquire([A, B], M, 0)
            assert isinstance(lease, Lease) and lease.owner is state.local
            state.release(lease, cooldown=5.0)
            lease = await state.acquire([A, B], M, 0)
            assert isinstance(lease, Lease) and lease.deployment is B  # the local rest holds
        finally:
            await state.close()

    asyncio.run(scenario())
