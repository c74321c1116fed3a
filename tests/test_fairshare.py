"""Each group's fair share of a process's calls in flight with no limit configured (gateway/fairshare.py),
and refusals recorded as a sample in a flood (gateway/refusals.py): the official OpenAI SDK against a
real gateway on loopback. The burst's effect on another group's latency is measured by ``python -m
bench.isolation`` (docs/operations.md, "Tenant isolation"), not here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from core.config import GroupLimits, LimitsSettings, ReliabilitySettings, Settings, StoreSettings
from gateway.fairshare import ACTIVE_SECONDS, group_cap
from tests.conftest import Stack

MODEL = "openai/gpt-4o-mini"
LONG = "[tokens:40] [delay:150]"  # ~6 s: held open until the test closes it
CAPACITY = 16  # [limits] fair_share_calls: a group holds at most 12 (a reserve of 4 for the others)


@pytest.fixture
def fstack(tmp_path: Path) -> Iterator[Stack]:
    limits = LimitsSettings(fair_share_calls=CAPACITY, groups={"own": GroupLimits(group_concurrent=50)})
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        limits=limits,
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    s = Stack(tmp_path, settings).start()
    yield s
    s.close_clients()
    s.stop()


def _open(client: openai.OpenAI) -> Any:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG}], stream=True
    )
    next(iter(stream))
    return stream


def _ask(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])


def test_a_burst_while_the_others_are_idle_is_refused_past_its_cap_and_shared_once_another_is_active(
    fstack: Stack,
) -> None:
    """Once another group has called lately, a group holds at most ``group_cap`` (12 of 16) calls in
    flight even while that one is idle: a burst that lands then is refused past it, not admitted
    whole, and the reserve serves the other when it comes back. Once that one is active, the first
    holds no more than its share (12 / 2)."""
    assert group_cap(CAPACITY) == 12
    a, b = fstack.client(fstack.key()), fstack.client(fstack.key())
    assert _ask(b).choices[0].message.content  # B called, and then goes idle
    time.sleep(ACTIVE_SECONDS + 0.2)
    held = [_open(a) for _ in range(12)]
    with pytest.raises(
        openai.RateLimitError
    ) as refused:  # nobody else active, and still refused past its cap
        _open(a)
    assert refused.value.code == "concurrency_limit_exceeded"
    assert refused.value.response.headers["retry-after"] == "1"
    assert "holds its share" in refused.value.message
    assert _ask(b).choices[0].message.content  # the reserve: B is served, and is now active
    for _ in range(6):  # B holds less than its share (6): admitted while A is refused
        held.append(_open(b))
    with pytest.raises(openai.RateLimitError):  # and no more
        _open(b)
    with pytest.raises(openai.RateLimitError):
        _open(a)
    for stream in held[:8]:  # A's calls end: its places come back, one by one, down to its share
        stream.close()
    deadline = time.monotonic() + 5
    while fstack.gateway.fair.counts.get(_group_id(fstack, a), 0) > 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    held.append(_open(a))
    for stream in held:
        stream.close()
    deadline = time.monotonic() + 5
    while fstack.gateway.fair.total and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fstack.gateway.fair.total == 0 and not fstack.gateway.fair.counts  # every place given back


def test_a_gateway_with_one_tenant_lets_it_hold_every_place(fstack: Stack) -> None:
    """Nobody else has called: no reserve is kept for anyone, the one group holds past the cap."""
    a = fstack.client(fstack.key())
    held = [_open(a) for _ in range(CAPACITY + 2)]
    assert fstack.gateway.fair.total == CAPACITY + 2
    for stream in held:
        stream.close()


def test_a_group_with_its_own_limit_and_batch_lines_take_no_share(fstack: Stack) -> None:
    own = fstack.client(fstack.key(group=fstack.group(name="own")))
    other = fstack.client(fstack.key())
    held = [_open(other)]
    held += [_open(own) for _ in range(6)]  # its group_concurrent (50) rules it, not the share
    assert fstack.gateway.fair.counts == {_group_id(fstack, other): 1}
    for stream in held:
        stream.close()


def test_a_flood_of_refusals_is_recorded_as_a_sample(fstack: Stack) -> None:
    group = fstack.group(credits=0.000001)  # too little for any call: each is refused 402
    client = fstack.client(fstack.key(group=group))

    def call(_: int) -> int:
        try:
            _ask(client)
        except openai.APIStatusError as exc:
            return exc.status_code
        return 200

    began = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(call, range(60)))
    took = time.monotonic() - began
    assert statuses == [402] * 60
    records = fstack.run(fstack.store.usage(group=group, limit=1000))
    assert all(r.status == "rejected" and r.error_code == "insufficient_credits" for r in records)
    seconds = int(took) + 2  # the calls' wall seconds (a record is kept for each of at most 10 a second)
    assert 10 <= len(records) <= 10 * seconds < 60, (len(records), took)
    time.sleep(1.1)  # a second later: the next refusal is recorded, and says how many it stands for
    assert call(0) == 402
    after = fstack.run(fstack.store.usage(group=group, limit=1000))
    noted = [int(r.error.split("(and ")[1].split(" ")[0]) for r in after if r.error and "(and " in r.error]
    assert len(after) == len(records) + 1 and sum(noted) == 60 - len(records), (len(records), noted)


def _group_id(stack: Stack, client: openai.OpenAI) -> int:
    principal = stack.run(stack.gateway.auth.authenticate(f"Bearer {client.api_key}"))
    return principal.group_id
