"""Deployments on the call path, through a real gateway and several instances of the OpenAI emulator
(each with its own key, some told an RPM): weights over 2,000 calls, a deployment answering 429s
rested for its Retry-After while the others serve, sticky conversations, every deployment resting,
two replicas sharing ceilings in Redis, and the deployment in the usage record, the access log,
/metrics and /readyz."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.config import ReliabilitySettings, Settings, parse_settings
from core.money import NANO
from emulators.anthropic import AnthropicEmulator
from emulators.openai import OpenAIEmulator
from tests.conftest import REDIS_URL, Stack, metric, raw_request
from tests.test_batches import lines_of, submit, wait
from tests.test_console import Client

TOKEN = "admin-token-for-deployment-tests"
CHEAP = {"model": "openai/gpt-4o-mini", "max_tokens": 1}


def configure(
    tmp: Path,
    names: list[str],
    *,
    reliability: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    jobs: dict[str, Any] | None = None,
    **provider: Any,
) -> Callable[[dict[str, str]], Settings]:
    """Settings whose openai/ group is one deployment per extra emulator; ``provider`` holds the group's
    other fields, ``<name>`` keys a deployment's own (weight, rpm, ...)."""

    def build(urls: dict[str, str]) -> Settings:
        items = [
            {"name": name, "base_url": urls[name] + "/v1", "api_key": f"key-{name}", **provider.pop(name, {})}
            for name in names
        ]
        raw: dict[str, Any] = {
            "store": {"url": f"sqlite:///{tmp}/router.db"},
            "console": {"admin_token": TOKEN},
            "reliability": {"max_retries": 0, "breaker_threshold": 10**9, **(reliability or {})},
            "providers": {"openai": {"deployments": items, **provider}},
            "routing": routing or {},
        }
        if limits:
            raw["limits"] = limits
        if jobs:
            raw["jobs"] = jobs
        return parse_settings(raw, "test")

    return build


def emulators(*names: str, tpm: dict[str, int] | None = None, **rpm: int) -> dict[str, OpenAIEmulator]:
    return {
        name: OpenAIEmulator("openai", f"key-{name}", rpm=rpm.get(name, 0), tpm=(tpm or {}).get(name, 0))
        for name in names
    }


def start(tmp: Path, extra: dict[str, OpenAIEmulator], build: Callable[[dict[str, str]], Settings]) -> Stack:
    return Stack(tmp, extra=extra, configure=build).start()  # type: ignore[arg-type]


def served(stack: Stack) -> dict[str, int]:
    return {name: e.served for name, e in stack.extra.items()}


@pytest.fixture(scope="module")
def weighted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("weighted")
    build = configure(tmp, ["a", "b", "c"], a={"weight": 1}, b={"weight": 2}, c={"weight": 5})
    stack = start(tmp, emulators("a", "b", "c"), build)
    yield stack
    stack.stop()


async def _many(stack: Stack, key: str, n: int, concurrency: int = 32) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with gate:
            return await client.chat.completions.create(
                messages=[{"role": "user", "content": f"n{i} [tokens:1]"}], **CHEAP
            )

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


@pytest.mark.slow  # (seconds of its own: not in make test-fast)
def test_weights_are_respected_over_2000_calls(weighted: Stack) -> None:
    n = 2000
    key = weighted.key(credits=1000)
    answers = asyncio.run(_many(weighted, key, n))
    assert all(a.choices[0].message.content for a in answers)
    counts = served(weighted)
    assert sum(counts.values()) == n
    for name, share in (("a", 1 / 8), ("b", 2 / 8), ("c", 5 / 8)):  # within 5 standard deviations
        assert abs(counts[name] - n * share) <= 5 * math.sqrt(n * share * (1 - share)), counts
    # the usage records name the deployment that served each call
    records = weighted.run(weighted.store.usage(limit=n + 10))
    assert Counter(r.deployment for r in records) == Counter(counts)
    assert {r.provider for r in records} == {"openai"}


def test_native_responses_are_routed_too(weighted: Stack) -> None:
    group = weighted.group(10)
    client = weighted.client(weighted.key(group=group))
    for i in range(6):
        out = client.responses.create(model="openai/gpt-4o-mini", input=f"Hello {i}", max_output_tokens=16)
        assert out.output_text
    records = weighted.run(weighted.store.usage(group=group))
    assert len(records) == 6 and {r.endpoint for r in records} == {"responses"}
    assert {r.deployment for r in records} <= {"a", "b", "c"} and all(r.deployment for r in records)


def test_the_console_filters_usage_by_deployment_and_sums_each(weighted: Stack) -> None:
    from tests.test_console import Client

    group = weighted.group(100)
    asyncio.run(_many(weighted, weighted.key(group=group), 40, concurrency=8))
    api = Client(weighted)
    everything = api.api("GET", f"/groups/{group}/usage?limit=100", token=TOKEN).json()["data"]
    counts = Counter(r["deployment"] for r in everything)
    assert sum(counts.values()) == 40 and set(counts) <= {"a", "b", "c"}
    name, most = counts.most_common(1)[0]
    only = api.api("GET", f"/groups/{group}/usage?limit=100&deployment={name}", token=TOKEN).json()["data"]
    assert len(only) == most and {r["deployment"] for r in only} == {name}
    assert api.api("GET", f"/groups/{group}/usage?deployment=no%20such", token=TOKEN).status == 400
    assert api.login(TOKEN).status == 303
    page = api.get(f"/console/groups/{group}/usage?deployment={name}").text
    assert f"deployment: <strong>{name}</strong>" in page and f"<option selected>{name}</option>" in page
    table = api.get(f"/console/groups/{group}/calls").text.split('id="by-deployment"')[1].split("</table>")[0]
    for deployment, calls in counts.items():
        assert re.search(rf">{deployment}</a></td>\s*<td class=\"num\">{calls}</td>", table), (
            deployment,
            table,
        )
    csv = api.get(f"/console/groups/{group}/usage.csv?deployment={name}").text.splitlines()
    assert "deployment" in csv[0].split(",") and len(csv) == most + 1


def test_metrics_readyz_and_access_log_name_deployments(weighted: Stack) -> None:
    from tests.conftest import Lines

    client = weighted.client()
    before = served(weighted)
    lines = Lines()
    logging.getLogger("router.access").addHandler(lines)
    try:
        client.chat.completions.create(
            messages=[{"role": "user", "content": "Hi"}], extra_headers={"x-request-id": "dep-log-1"}, **CHEAP
        )
        entry = lines.find("dep-log-1")
    finally:
        logging.getLogger("router.access").removeHandler(lines)
    (name,) = [n for n, count in served(weighted).items() if count != before[n]]
    assert entry["deployment"] == name and entry["provider"] == "openai"
    text = raw_request(weighted, "GET", "/metrics").text
    assert f'router_deployment_calls_total{{deployment="{name}",outcome="ok",provider="openai"}}' in text
    assert f'router_deployment_in_flight{{deployment="{name}",provider="openai"}} 0.0' in text
    ready = raw_request(weighted, "GET", "/readyz").json()
    assert {"openai/a", "openai/b", "openai/c", "anthropic"} <= set(ready["upstreams"])
    assert ready["deployments"]["openai/a"] == {"in_flight": 0, "resting": {}}
    assert ready["circuits"]["openai/b"] == "closed"


@pytest.mark.slow  # (seconds of its own: not in make test-fast)
def test_a_deployment_answering_429_rests_for_its_retry_after_and_callers_never_see_it(
    tmp_path: Path,
) -> None:
    # 'a' takes 20 requests a minute: after one, it answers 429 with Retry-After 3 (s); 'b' has room.
    # 'a' weighs 3: it would take most calls if it did not rest
    stack = start(tmp_path, emulators("a", "b", a=20), configure(tmp_path, ["a", "b"], a={"weight": 3}))
    try:
        client = stack.client()
        a = stack.extra["a"]
        rests = 'router_deployment_cooldowns_total{deployment="a",provider="openai"}'
        before = metric(stack, rests)
        first = time.monotonic()
        for i in range(20):  # well within the 3 s 'a' rests
            out = client.chat.completions.create(messages=[{"role": "user", "content": f"q{i}"}], **CHEAP)
            assert out.choices[0].message.content
        assert time.monotonic() - first < 2.5, "the calls took longer than the rest: the test proves nothing"
        assert (a.served, a.refused) == (1, 1)  # one 429, then left alone while it rests
        assert stack.extra["b"].served == 19
        assert metric(stack, rests) == before + 1
        # the call 'a' refused says so in its record, and on its page in the console
        (moved,) = [r for r in stack.run(stack.store.usage(limit=50)) if r.attempts]
        tries = json.loads(moved.attempts or "")
        assert [t[0] for t in tries] == ["a", "b"] and tries[0][1] != "ok" and tries[1][1] == "ok"
        assert moved.deployment == "b" and moved.status == "ok" and all(t[2] >= 0 for t in tries)
        console = Client(stack)
        assert console.login(TOKEN).status == 303
        page = console.get(f"/console/calls/{moved.id}").text
        assert re.search(rf"<td>1</td><td>a</td><td><code>{re.escape(tries[0][1])}</code></td>", page), page
        assert "<td>2</td><td>b</td><td>answered</td>" in page
        time.sleep(3.2)  # the rest is over: 'a' serves again
        for i in range(12):
            client.chat.completions.create(messages=[{"role": "user", "content": f"r{i}"}], **CHEAP)
        assert a.served >= 2
    finally:
        stack.stop()


def test_every_deployment_resting_is_a_429_with_the_earliest_retry_after_or_the_fallback(
    tmp_path: Path,
) -> None:
    build = configure(tmp_path, ["a", "b"], a={"rpm": 1}, b={"rpm": 2}, routing={"max_cooldown": 300})
    stack = start(tmp_path, emulators("a", "b"), build)
    try:
        client = stack.client()
        for i in range(2):  # one each: both at their ceiling (1 and 2 a minute, a bucket of one minute)
            client.chat.completions.create(messages=[{"role": "user", "content": f"q{i}"}], **CHEAP)
        client.chat.completions.create(messages=[{"role": "user", "content": "q3"}], **CHEAP)  # b's second
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(messages=[{"role": "user", "content": "q4"}], **CHEAP)
        after = int(refused.value.response.headers["retry-after"])
        assert 25 <= after <= 30  # b's next room, the earliest (a's is a minute away)
        assert "cooling down or at its rate ceiling" in refused.value.message
        fallback = client.chat.completions.create(
            messages=[{"role": "user", "content": "q5"}],
            extra_body={"models": ["mistral/mistral-small-latest"]},
            **CHEAP,
        )
        assert fallback.model == "mistral/mistral-small-latest"
        assert served(stack) == {"a": 1, "b": 2}
    finally:
        stack.stop()


LARGE = "word " * 400  # about 400 tokens: over an account allowing 300 tokens a minute


def test_a_call_too_large_for_the_providers_account_rests_no_deployment(tmp_path: Path) -> None:
    """OpenAI's "Request too large" 429 (the call alone is over the account's tokens per minute) is
    not a rate limit: no wait cures it. One group's such call is tried once on each deployment, never
    retried (by the gateway, the openai SDK or the batch runner), rests no deployment, so another
    group's calls are served at once; the caller learns the limit and its request's size, not the
    gateway's organization. (As a rate limit, it rested both deployments for [routing] cooldown and
    the other group got 429s.)"""
    build = configure(tmp_path, ["a", "b"], jobs={"poll_interval": 0.05})
    stack = start(tmp_path, emulators("a", "b", tpm={"a": 300, "b": 300}), build)
    big = f"{LARGE} {time.time()}"
    group = stack.group(100)
    sdk = openai.OpenAI(
        base_url=stack.base_url, api_key=stack.key(group=group), max_retries=2
    )  # the SDK's default
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(messages=[{"role": "user", "content": big}], **CHEAP)
        error, headers = refused.value, refused.value.response.headers
        assert error.code == "rate_limit_exceeded" and error.type == "tokens"  # type: ignore[attr-defined]
        assert "Request too large" in error.message and "limit 300, requested 4" in error.message
        assert "org-" not in error.message and "organization" not in error.message
        assert headers.get("x-should-retry") == "false" and "retry-after" not in headers
        sent = [r for e in stack.extra.values() for r in e.requests if big in str(r["messages"])]
        assert len(sent) == 2  # once on each deployment: no retry anywhere

        other = stack.client()  # another group, at once
        for i in range(6):
            assert other.chat.completions.create(
                messages=[{"role": "user", "content": f"small {i}"}], **CHEAP
            )

        batch = submit(
            other,
            [
                {
                    "custom_id": "big",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": big + " batch"}], **CHEAP},
                }
            ],
        )
        batch = wait(other, batch.id, seconds=30)
        [line] = lines_of(other, batch.error_file_id)
        assert line["response"]["status_code"] == 429
        sent = [r for e in stack.extra.values() for r in e.requests if big + " batch" in str(r["messages"])]
        assert len(sent) == 2  # the batch runner did not try the line again
        records = stack.run(stack.store.usage(group=group))
        assert records and {r.status for r in records} == {"error"} and sum(r.credits for r in records) == 0
        assert stack.run(stack.store.get_group(group)).balance == 100 * NANO  # the refused call cost nothing
    finally:
        sdk.close()
        stack.stop()


def test_a_prompt_over_anthropics_input_tokens_per_minute_rests_no_deployment(tmp_path: Path) -> None:
    """Anthropic says the same words ("would exceed the rate limit for your organization of N input
    tokens per minute") whether the minute's usage or the request alone is over N. A prompt well over
    N (the gateway's own count, by a quarter) is too large, as OpenAI's "Request too large": tried on
    each deployment once, never retried, no deployment rests, so another group's calls are served at
    once; a 429 for the minute's usage (a small prompt) stays a rate limit. (Before, both deployments
    rested for the Retry-After and the other group's call got 429 "cooling down".)"""

    def build(urls: dict[str, str]) -> Settings:
        items = [
            {"name": name, "base_url": urls[name] + "/v1", "api_key": f"key-{name}"} for name in ("a", "b")
        ]
        return parse_settings(
            {
                "store": {"url": f"sqlite:///{tmp_path}/router.db"},
                "reliability": {"max_retries": 0, "breaker_threshold": 10**9},
                "providers": {"anthropic": {"deployments": items}},
            },
            "test",
        )

    extra = {name: AnthropicEmulator(f"key-{name}", itpm=300) for name in ("a", "b")}
    stack = Stack(tmp_path, extra=extra, configure=build).start()  # type: ignore[arg-type]
    sdk = openai.OpenAI(base_url=stack.base_url, api_key=stack.key(), max_retries=2)  # the SDK's default
    model = {"model": "anthropic/claude-haiku-4-5", "max_tokens": 5}
    try:
        big = f"{LARGE} {time.time()}"
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(messages=[{"role": "user", "content": big}], **model)
        error, headers = refused.value, refused.value.response.headers
        assert error.type == "tokens" and "limit 300, requested about 4" in error.message  # type: ignore[attr-defined]
        assert "organization" not in error.message and headers.get("x-should-retry") == "false"
        sent = [r for e in extra.values() for r in e.requests if big in str(r["messages"])]
        assert len(sent) == 2  # once on each deployment
        other = stack.client()  # another group, at once: no deployment rests
        assert other.chat.completions.create(messages=[{"role": "user", "content": "small"}], **model)
        with pytest.raises(openai.RateLimitError) as limited:  # the minute's usage: a rate limit, as before
            other.chat.completions.create(
                messages=[{"role": "user", "content": "small [fault:429]"}], **model
            )
        assert limited.value.type == "rate_limit_error"  # type: ignore[attr-defined]
    finally:
        sdk.close()
        stack.stop()


def test_a_call_too_large_for_one_account_is_served_by_a_larger_one(tmp_path: Path) -> None:
    stack = start(
        tmp_path, emulators("small", "large", tpm={"small": 300}), configure(tmp_path, ["small", "large"])
    )
    try:
        client = stack.client()
        for i in range(4):
            out = client.chat.completions.create(
                messages=[{"role": "user", "content": f"{LARGE} {i}"}], **CHEAP
            )
            assert out.choices[0].message.content
        assert stack.extra["large"].served == 4
        for i in range(8):  # the small one rests for none of it: it still serves small calls
            client.chat.completions.create(messages=[{"role": "user", "content": f"small {i}"}], **CHEAP)
        assert stack.extra["small"].served > sum(
            1 for r in stack.extra["small"].requests if LARGE in str(r["messages"])
        )
    finally:
        stack.stop()


def test_a_call_over_every_declared_tpm_ceiling_is_refused_once_and_never_sent(tmp_path: Path) -> None:
    """The gateway's own version of the same: deployments that declare their TPM ceiling, a call
    larger than all of them: 429 without Retry-After and with x-should-retry: false (the openai SDK,
    with its default 2 retries, sends it once), nothing sent upstream."""
    build = configure(tmp_path, ["a", "b"], a={"tpm": 300}, b={"tpm": 300})
    stack = start(tmp_path, emulators("a", "b"), build)
    sdk = openai.OpenAI(base_url=stack.base_url, api_key=stack.key(), max_retries=2)
    try:
        began = metric(stack, 'router_requests_total{endpoint="/v1/chat/completions",status="429"}')
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(messages=[{"role": "user", "content": LARGE}], **CHEAP)
        assert "larger than the tokens-per-minute ceiling of every deployment" in refused.value.message
        headers = refused.value.response.headers
        assert headers.get("x-should-retry") == "false" and "retry-after" not in headers
        assert (
            metric(stack, 'router_requests_total{endpoint="/v1/chat/completions",status="429"}') == began + 1
        )
        assert served(stack) == {"a": 0, "b": 0}
    finally:
        sdk.close()
        stack.stop()


def test_latency_routing_ranks_non_stream_calls_by_time_per_output_token(tmp_path: Path) -> None:
    """Under latency routing a non-stream call's measure is its answer's time over its output tokens
    (as LiteLLM's lowest-latency routing), not the whole answer's time: one group's long answers on
    the faster deployment do not send every other group's calls to the slower one. (Ranked by the
    whole time, the 300-token answer made 'fast' look slower than 'slow' and group B's ten calls all
    went to 'slow'.)"""
    extra = {
        "fast": OpenAIEmulator("openai", "key-fast", ms_per_token=1),
        "slow": OpenAIEmulator("openai", "key-slow", ms_per_token=4),
    }
    build = configure(
        tmp_path, ["fast", "slow"], routing={"exploration": 0}, model_routing={"gpt-4o-mini": "latency"}
    )
    stack = start(tmp_path, extra, build)
    try:
        a, b = stack.client(), stack.client()  # two groups

        def call(client: openai.OpenAI, tokens: int) -> int:
            out = client.chat.completions.create(
                model="openai/gpt-4o-mini",
                max_tokens=1000,
                messages=[{"role": "user", "content": f"[tokens:{tokens}]"}],
            )
            assert out.usage is not None
            return out.usage.completion_tokens

        assert [call(b, 20), call(b, 20)] == [20, 20]  # one each: an unmeasured deployment goes first
        assert served(stack) == {"fast": 1, "slow": 1}
        assert call(a, 300) == 300  # group A's long answer, on the faster one: 0.3 s
        assert served(stack) == {"fast": 2, "slow": 1}
        for _ in range(10):
            call(b, 20)
        assert served(stack) == {"fast": 12, "slow": 1}
    finally:
        stack.stop()


def test_sticky_routing_keeps_a_10_turn_conversation_on_one_deployment(tmp_path: Path) -> None:
    stack = start(tmp_path, emulators("a", "b", "c"), configure(tmp_path, ["a", "b", "c"], sticky=True))
    try:
        client = stack.client()
        firsts: set[str] = set()
        for conversation in range(12):
            before = served(stack)
            messages = [{"role": "system", "content": f"You are helper {conversation}."}]
            for turn in range(10):
                messages.append({"role": "user", "content": f"turn {turn}"})
                out = client.chat.completions.create(messages=messages, **CHEAP)  # type: ignore[arg-type]
                messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
            moved = {n: c - before[n] for n, c in served(stack).items() if c != before[n]}
            assert list(moved.values()) == [10], moved  # all ten turns on one deployment
            firsts |= set(moved)
        assert len(firsts) > 1  # and different conversations on different deployments
        for user in (
            "u-1",
            "u-2",
            "u-3",
        ):  # Responses calls chained by the caller's user: one deployment each
            group = stack.group(10)
            chained = stack.client(stack.key(group=group))
            for turn in range(5):
                chained.responses.create(
                    model="openai/gpt-4o-mini", input=f"turn {turn}", user=user, max_output_tokens=16
                )
            records = stack.run(stack.store.usage(group=group))
            assert len(records) == 5 and len({r.deployment for r in records}) == 1
    finally:
        stack.stop()


def test_two_replicas_share_the_ceilings_and_rests_in_redis(tmp_path: Path) -> None:
    prefix = f"test:dep:{secrets.token_hex(4)}"
    shared = {"limits": {"redis_url": REDIS_URL}, "routing": {"redis_prefix": prefix}}
    one = start(
        tmp_path / "one",
        emulators("a", "b"),
        configure(tmp_path / "one", ["a", "b"], a={"rpm": 3}, b={"rpm": 3}, **shared),
    )  # type: ignore[arg-type]
    urls = {name: url for name, url in one.extra_urls.items()}

    def second(_: dict[str, str]) -> Settings:
        return configure(tmp_path / "two", ["a", "b"], a={"rpm": 3}, b={"rpm": 3}, **shared)(urls)  # type: ignore[arg-type]

    two = Stack(tmp_path / "two", configure=second).start()
    try:
        clients = [one.client(), two.client()]
        for i in range(6):  # alternating replicas: 3 a minute on each deployment, all replicas together
            clients[i % 2].chat.completions.create(messages=[{"role": "user", "content": f"q{i}"}], **CHEAP)
        for client in clients:
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(messages=[{"role": "user", "content": "more"}], **CHEAP)
        assert (one.extra["a"].served, one.extra["b"].served) == (3, 3)
    finally:
        two.stop()
        one.stop()


def test_a_rest_begun_on_one_replica_is_kept_by_the_other(tmp_path: Path) -> None:
    prefix = f"test:dep:{secrets.token_hex(4)}"
    shared = {"limits": {"redis_url": REDIS_URL}, "routing": {"redis_prefix": prefix}}
    # 'a' answers 429 (Retry-After 3 s) after its first call; 'b' has room. 'a' weighs 10: both
    # replicas would send it nearly every call if it did not rest
    one = start(
        tmp_path / "one",
        emulators("a", "b", a=20),
        configure(tmp_path / "one", ["a", "b"], a={"weight": 10}, **shared),
    )  # type: ignore[arg-type]
    urls = dict(one.extra_urls)
    two = Stack(
        tmp_path / "two",
        configure=lambda _: configure(tmp_path / "two", ["a", "b"], a={"weight": 10}, **shared)(urls),
    ).start()  # type: ignore[arg-type]
    try:
        first, other = one.client(), two.client()
        a = one.extra["a"]
        for i in range(10):
            first.chat.completions.create(messages=[{"role": "user", "content": f"q{i}"}], **CHEAP)
            if a.refused:
                break
        assert a.refused == 1
        for i in range(10):  # the other replica never tries 'a' while it rests
            other.chat.completions.create(messages=[{"role": "user", "content": f"r{i}"}], **CHEAP)
        assert a.refused == 1 and a.served == 1
    finally:
        two.stop()
        one.stop()


def test_default_single_deployment_settings_need_no_redis_round_trip(tmp_path: Path) -> None:
    settings = Settings(
        limits=parse_settings({"limits": {"redis_url": REDIS_URL}}).limits, reliability=ReliabilitySettings()
    )
    from gateway.state import Gateway

    gw = Gateway(settings)
    assert gw.dispatcher.shared is gw.dispatcher.local  # nothing worth sharing: no Redis client at all


def test_each_deployment_has_its_own_circuit(tmp_path: Path) -> None:
    from tests.conftest import free_port

    def build(urls: dict[str, str]) -> Settings:
        urls = {**urls, "dead": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
        return configure(
            tmp_path,
            ["dead", "b"],
            reliability={"breaker_threshold": 2, "breaker_cooldown": 60},
            dead={"weight": 10},
        )(urls)

    stack = start(tmp_path, emulators("b"), build)
    try:
        client = stack.client()
        for i in range(8):  # every call served: the dead deployment's failures move it to 'b'
            assert client.chat.completions.create(messages=[{"role": "user", "content": f"q{i}"}], **CHEAP)
        circuits = raw_request(stack, "GET", "/readyz").json()["circuits"]
        assert circuits["openai/dead"] == "open" and circuits["openai/b"] == "closed"
        failed = metric(
            stack, 'router_deployment_calls_total{deployment="dead",outcome="error",provider="openai"}'
        )
        assert failed == 2  # two failures opened it; then it was skipped, not tried
        assert stack.extra["b"].served == 8
    finally:
        stack.stop()


def test_a_deployment_that_answers_404_for_a_model_is_failed_over_and_left_out(tmp_path: Path) -> None:
    """One deployment lacks images (an emulator without the route: aiohttp's plain 404), the other has
    them: every image call succeeds on the first try of the caller, the 404 one is tried once and then
    left out of that model's calls, and its chat calls go on."""
    extra = {"noimg": OpenAIEmulator("upstage", "key-noimg"), "full": OpenAIEmulator("openai", "key-full")}
    build = configure(tmp_path, ["noimg", "full"], noimg={"weight": 1000})  # (tried first, nearly always)
    stack = start(tmp_path, extra, build)  # type: ignore[arg-type]
    try:
        group = stack.group()
        client = stack.client(stack.key(group=group))
        before = metric(stack, 'router_upstream_errors_total{provider="openai",status="404"}')
        for _ in range(8):
            image = client.images.generate(
                model="openai/gpt-image-1", prompt="a red square", size="1024x1024"
            )
            assert image.data and image.data[0].b64_json
        records = stack.run(stack.store.usage(group=group))
        assert {r.deployment for r in records} == {"full"} and all(r.status == "ok" for r in records)
        assert metric(stack, 'router_upstream_errors_total{provider="openai",status="404"}') - before == 1
        for _ in range(4):
            client.chat.completions.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
        chats = stack.run(stack.store.usage(group=group, limit=100))
        assert "noimg" in {
            r.deployment for r in chats if r.endpoint == "chat"
        }  # (left out of image calls only)
    finally:
        stack.stop()


def test_a_deployment_takes_only_the_endpoints_it_declares(tmp_path: Path) -> None:
    build = configure(tmp_path, ["chatonly", "all"], chatonly={"endpoints": ["chat"]})
    stack = start(tmp_path, emulators("chatonly", "all"), build)
    try:
        group = stack.group()
        client = stack.client(stack.key(group=group))
        for _ in range(10):
            client.embeddings.create(model="openai/text-embedding-3-small", input="one")
            client.chat.completions.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
        records = stack.run(stack.store.usage(group=group, limit=100))
        assert {r.deployment for r in records if r.endpoint == "embeddings"} == {"all"}
        assert {r.deployment for r in records if r.endpoint == "chat"} == {"chatonly", "all"}
        assert stack.extra["chatonly"].served == len([r for r in records if r.deployment == "chatonly"])
    finally:
        stack.stop()
