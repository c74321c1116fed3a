"""Calls in flight per key and per group (gateway/concurrency.py): the official OpenAI SDK against a real
gateway on loopback, the limits in memory and, for replicas, in the real Redis.

Places are taken at admission and given back whatever ends the call: the answer, the stream's end, the
caller's disconnect, an upstream error, a refusal after admission (402). A refusal is a 429 with
Retry-After, reserves nothing and leaves a ``rejected`` record. Batch lines and background responses
take no caller's place. With Redis, replicas share the count; a replica's places are renewed while its
calls run and expire when it dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from billing.store import Principal
from core.config import (
    GroupLimits,
    JobsSettings,
    LimitsSettings,
    ReliabilitySettings,
    Settings,
    StoreSettings,
)
from core.errors import RateLimited
from gateway import backends
from gateway.concurrency import InFlight, MemoryBackend, Place
from gateway.concurrency_redis import RedisBackend
from tests.conftest import REDIS_URL, Stack, free_port
from tests.test_batches import request as batch_line
from tests.test_batches import submit, wait

MODEL = "openai/gpt-4o-mini"
LONG = "[tokens:40] [delay:150]"  # a stream of ~6 s: held open until the test closes it


def _settings(tmp: Path, limits: LimitsSettings, store_url: str = "", **kw: Any) -> Settings:
    return Settings(
        store=StoreSettings(url=store_url or f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        limits=limits,
        **kw,
    )


@pytest.fixture(scope="module")
def cstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("concurrency")
    limits = LimitsSettings(
        key_concurrent=2,
        group_concurrent=3,
        groups={"solo": GroupLimits(key_concurrent=1), "solo-broke": GroupLimits(key_concurrent=1)},
    )
    jobs = JobsSettings(poll_interval=0.05, concurrency=4, stop_grace=1.0, lease_seconds=3.0)
    s = Stack(tmp, _settings(tmp, limits, jobs=jobs)).start()
    yield s
    s.close_clients()
    s.stop()


def _open_stream(client: openai.OpenAI, text: str = LONG) -> Any:
    """A stream whose first chunk has arrived: the call is in flight."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], stream=True
    )
    next(iter(stream))
    return stream


def _ask(client: openai.OpenAI, text: str = "hello") -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])


def _refused(call: Callable[[], Any]) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as info:
        call()
    return info.value


def _eventually(call: Callable[[], Any], seconds: float = 5.0) -> Any:
    """``call()`` once it is no longer refused for calls in flight (a place is given back when the
    gateway sees the call end: a disconnect takes it a moment)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except openai.RateLimitError as exc:
            assert exc.code == "concurrency_limit_exceeded" and time.monotonic() < deadline, exc
            time.sleep(0.05)


def test_a_keys_and_a_groups_calls_in_flight_are_capped(cstack: Stack) -> None:
    group = cstack.group(10)
    first, second = cstack.client(cstack.key(group=group)), cstack.client(cstack.key(group=group))
    other = cstack.client()  # another group: its own counts
    held = [_open_stream(first), _open_stream(first)]
    before = cstack.run(cstack.store.get_group(group))
    records = len(cstack.run(cstack.store.usage(group=group)))
    sent = len(cstack.emulator("openai").requests)
    refusal = _refused(lambda: _ask(first))
    assert refusal.status_code == 429 and refusal.code == "concurrency_limit_exceeded"
    assert "this API key: limit 2" in refusal.message
    assert refusal.response.headers["retry-after"] == "1"
    held.append(_open_stream(second))  # the group's third
    group_refusal = _refused(lambda: _ask(second))
    assert "this key's group: limit 3" in group_refusal.message
    held += [_open_stream(other), _open_stream(other)]  # another group is not held back
    assert len(cstack.emulator("openai").requests) == sent + 3  # (the two refused were not sent upstream)
    after = cstack.run(cstack.store.get_group(group))
    assert after.balance == before.balance  # the refusals reserved nothing and cost nothing
    rows = cstack.run(cstack.store.usage(group=group))
    assert len(rows) == records + 2
    assert {(r.status, r.credits, r.error_code) for r in rows[:2]} == {
        ("rejected", 0, "concurrency_limit_exceeded")
    }
    held[0].close()  # the caller goes away mid-stream: its place is given back
    assert _eventually(lambda: _ask(first)).choices[0].message.content
    for stream in held[1:]:
        stream.close()
    streams = [_eventually(lambda: _open_stream(first, "[tokens:5]")) for _ in range(2)]  # all given back
    for stream in streams:
        assert list(stream)  # read to the end: the stream's own end gives the place back
    assert _ask(first).choices[0].message.content and _ask(first).choices[0].message.content


def test_every_way_a_call_ends_gives_its_place_back(cstack: Stack) -> None:
    """A key allowed one call in flight makes calls that end every way, one after the other: had any
    kept its place, the next would be refused."""
    key = cstack.key(group=_solo_group(cstack))
    one = cstack.client(key)
    with pytest.raises(openai.InternalServerError):
        _ask(one, "[fault:500]")  # the upstream fails
    with pytest.raises(openai.APIError):
        list(
            cstack.client(key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "[tokens:30] [cut:3]"}], stream=True
            )
        )
    with pytest.raises(openai.APIError):
        list(
            one.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "[midfail]"}], stream=True
            )
        )
    assert _eventually(lambda: _ask(one)).choices[0].message.content  # answered, non-stream
    assert list(
        one.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    held = _open_stream(one)
    assert _refused(lambda: _ask(one)).code == "concurrency_limit_exceeded"  # (the limit is 1)
    held.close()
    assert _eventually(lambda: _ask(one)).choices[0].message.content
    broke = cstack.client(
        cstack.key(credits=0, group=_solo_group(cstack, "solo-broke", 0))
    )  # 402 after admission
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as info:
            _ask(broke)
        assert info.value.status_code == 402


def _solo_group(stack: Stack, name: str = "solo", credits: float = 10) -> str:
    """The group ``name``, made once; ``solo``'s keys may have one call in flight."""
    if stack.run(stack.store.get_group(name)) is None:
        stack.group(credits, name=name)
    return name


def test_batch_lines_and_background_responses_take_no_callers_place(cstack: Stack) -> None:
    key = cstack.key(group=_solo_group(cstack))
    client = cstack.client(key)
    held = _open_stream(client)  # the key's one place is taken
    try:
        batch = submit(client, [batch_line(f"l{n}", MODEL, f"line {n} [slow:50]") for n in range(6)])
        done = wait(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 6  # 4 at a time, none refused
        queued = client.responses.create(model=MODEL, input="in the background", background=True)
        deadline = time.monotonic() + 20
        while (found := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert found.status == "completed" and found.output_text
        assert _refused(lambda: _ask(client)).code == "concurrency_limit_exceeded"  # still held by the stream
    finally:
        held.close()


# -- the backends ---------------------------------------------------------------------------------------
async def test_memory_backend_takes_a_place_in_every_count_or_in_none() -> None:
    backend = MemoryBackend()
    key, group = Place("k", 2, "key_concurrent"), Place("g", 1, "group_concurrent")
    assert await backend.enter([key, group], "a") == -1
    assert await backend.enter([key, group], "b") == 1  # the group is full: the key's count not taken
    assert backend.counts == {"k": 1, "g": 1}
    backend.leave([key, group], "a")
    assert backend.counts == {}


async def test_redis_counts_are_shared_atomic_and_renewed(redis_prefix: str) -> None:
    replicas = [RedisBackend(REDIS_URL, redis_prefix, timeout=5, lease=0.6) for _ in range(3)]
    try:
        await replicas[0].client.script_flush()  # the first call finds no script and loads it
        places = [
            Place(redis_prefix + "{g1}:k1:f", 5, "key_concurrent"),
            Place(redis_prefix + "{g1}:g:f", 7, "group_concurrent"),
        ]
        results = await asyncio.gather(
            *(r.enter(places, f"{n}:{i}") for n, r in enumerate(replicas) for i in range(4))
        )
        assert sorted(results) == [-1] * 5 + [0] * 7  # 12 at once on three replicas: exactly 5 admitted
        await asyncio.sleep(1.5)  # past the lease, twice over: renewed every 0.15 s while they run
        assert await replicas[0].enter(places, "late") == 0
        for n, r in enumerate(replicas):  # the admitted ones end
            for i in range(4):
                if f"{n}:{i}" in r.live.get(places[0].name, set()):
                    r.leave(places, f"{n}:{i}")
        deadline = time.monotonic() + 2
        while await replicas[1].enter(places, "after") != -1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    finally:
        for r in replicas:
            await r.close()


async def test_a_dead_replicas_places_expire_with_their_lease(redis_prefix: str) -> None:
    dead, alive = (RedisBackend(REDIS_URL, redis_prefix, timeout=5, lease=0.5) for _ in range(2))
    places = [Place(redis_prefix + "{g2}:k2:f", 1, "key_concurrent")]
    try:
        assert await dead.enter(places, "held") == -1
        await dead.renewer.stop()  # the replica dies: no renewal, no leave
        await dead.pipe.close()
        assert await alive.enter(places, "next") == 0
        await asyncio.sleep(0.7)
        assert await alive.enter(places, "next") == -1
    finally:
        await dead.client.aclose()
        await alive.close()


async def test_an_unreachable_redis_fails_open_or_closed_as_configured() -> None:
    who = Principal(1, "k", 1, "g", None, None)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    for fail_open in (True, False):
        limits = LimitsSettings(key_concurrent=1, redis_url=dead, redis_timeout=0.2, fail_open=fail_open)
        limiter = InFlight(limits, backends.in_flight(limits, None))
        try:
            if fail_open:
                assert await limiter.enter(who) is None  # admitted, uncounted
            else:
                with pytest.raises(RateLimited) as info:
                    await limiter.enter(who)
                assert info.value.headers["Retry-After"] == "1"
        finally:
            await limiter.close()


def test_two_replicas_share_one_count_through_redis(tmp_path: Path, redis_prefix: str, pg: Any) -> None:
    url = pg.fresh_url()
    # (with a rate limit as well: both checks share one Redis connection and round trip)
    limits = LimitsSettings(key_concurrent=1, key_rpm=1000, redis_url=REDIS_URL, redis_prefix=redis_prefix)
    stacks = [Stack(tmp_path / n, _settings(tmp_path, limits, url)).start() for n in ("a", "b")]
    try:
        key = stacks[0].key()
        one, two = stacks[0].client(key), stacks[1].client(key)
        held = _open_stream(one)
        refusal = _refused(lambda: _ask(two))
        assert refusal.code == "concurrency_limit_exceeded"
        held.close()
        assert _eventually(lambda: _ask(two)).choices[0].message.content
        held = _open_stream(two)
        assert _refused(lambda: _ask(one)).code == "concurrency_limit_exceeded"
        held.close()
        assert _eventually(lambda: _ask(one)).choices[0].message.content
    finally:
        for stack in stacks:
            stack.close_clients()
            stack.stop()
