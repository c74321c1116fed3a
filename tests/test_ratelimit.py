"""Rate limits: the GCRA arithmetic, both backends (memory, and the real Redis), the gateway's 429s and
headers in one process, and one allowance shared by two gateway processes through Redis."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from core.config import GroupLimits, LimitsSettings, ReliabilitySettings, Settings, StoreSettings
from core.errors import RateLimited
from gateway import backends
from gateway.ratelimit import NEVER, Bucket, duration, gcra
from gateway.ratelimit_memory import MemoryBackend
from gateway.ratelimit_redis import RedisBackend
from tests.conftest import ADMIN_URL, REDIS_URL, Stack, free_port, pg_admin, run_sync, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-4o-mini"


# -- the arithmetic --------------------------------------------------------------------------------
def test_gcra_admits_the_limit_then_refuses_until_one_interval_passes() -> None:
    now, tat = 1000.0, 0.0
    for left in (1, 0):
        room, tat, state = gcra(tat, now, limit=2, cost=1)
        assert room and state.remaining == left and state.retry_after == 0
    room, same, state = gcra(tat, now, limit=2, cost=1)
    assert not room and same == tat and state.remaining == 0
    assert state.retry_after == pytest.approx(30.0) and state.reset == pytest.approx(60.0)
    room, _, state = gcra(tat, now + 30, limit=2, cost=1)
    assert room and state.remaining == 0
    room, _, state = gcra(0.0, now, limit=100, cost=101)  # can never fit
    assert not room and state.retry_after == NEVER and state.remaining == 100


def test_duration_is_openais_style() -> None:
    assert [duration(s) for s in (0, 0.0201, 0.5, 1, 1.5, 6, 59.9996, 60, 360, 3725)] == [
        "0s",
        "21ms",
        "500ms",
        "1s",
        "1.5s",
        "6s",
        "1m0s",
        "1m0s",
        "6m0s",
        "1h2m5s",
    ]


async def test_memory_backend_takes_from_all_buckets_or_from_none() -> None:
    clock = [0.0]
    backend = MemoryBackend(clock=lambda: clock[0])
    key, group = Bucket("k", 10, 1), Bucket("g", 1, 1)
    ok, states = await backend.take([key, group])
    assert ok and [s.remaining for s in states] == [9, 0]
    ok, states = await backend.take([key, group])
    assert not ok and [s.remaining for s in states] == [9, 0]  # the key's bucket was not charged
    assert states[0].retry_after == 0 and states[1].retry_after == pytest.approx(60.0)
    clock[0] = 60.0
    ok, _ = await backend.take([key, group])
    assert ok


# -- the Redis backend against the real server -------------------------------------------------------
async def test_redis_backend_matches_the_memory_backend(redis_prefix: str) -> None:
    backend = RedisBackend(REDIS_URL, redis_prefix)
    memory = MemoryBackend()
    try:
        assert await backend.ping()
        await backend.client.script_flush()  # the first check finds no script and loads it
        calls = [
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 200)],
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 200)],
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 200)],  # tokens: refused
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 50)],
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 50)],  # requests: refused
            [Bucket(redis_prefix + "k", 3, 1), Bucket(redis_prefix + "t", 500, 501)],  # never fits
        ]
        for buckets in calls:
            ok_r, states_r = await backend.take(buckets)
            ok_m, states_m = await memory.take(buckets)
            assert ok_r == ok_m
            for r, m in zip(states_r, states_m, strict=True):
                assert r.remaining == m.remaining
                assert r.reset == pytest.approx(m.reset, abs=0.5)
                assert r.retry_after == pytest.approx(m.retry_after, abs=0.5)
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            ttl = await client.pttl(redis_prefix + "k")
            assert 0 < ttl <= 61_000  # buckets expire once full again
        finally:
            await client.aclose()
    finally:
        await backend.close()


async def test_redis_checks_are_atomic_under_concurrency(redis_prefix: str) -> None:
    backends = [RedisBackend(REDIS_URL, redis_prefix, timeout=5) for _ in range(4)]
    try:
        buckets = [Bucket(redis_prefix + "k", 25, 1), Bucket(redis_prefix + "g", 1000, 1)]
        results = await asyncio.gather(*(b.take(buckets) for b in backends for _ in range(20)))
        assert sum(1 for ok, _ in results if ok) == 25
    finally:
        for b in backends:
            await b.close()


async def test_an_unreachable_redis_fails_open_or_closed_as_configured() -> None:
    from billing.store import Principal
    from core.catalog import Catalog
    from core.metrics import RATELIMIT_ERRORS
    from core.wire import parse_chat_request
    from gateway.ratelimit import RateLimiter

    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    _, req = parse_chat_request(body)
    model = Catalog.load(None).resolve(MODEL)
    who = Principal(1, "k", 1, "g", None, None)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    errors = RATELIMIT_ERRORS._value.get()
    for fail_open in (True, False):
        limits = LimitsSettings(key_rpm=5, redis_url=dead, redis_timeout=0.2, fail_open=fail_open)
        limiter = RateLimiter(limits, backends.rate_limits(limits))
        try:
            if fail_open:
                assert await limiter.admit(who, model, len(body), req) is None  # admitted, unchecked
            else:
                with pytest.raises(RateLimited) as info:
                    await limiter.admit(who, model, len(body), req)
                assert info.value.headers["Retry-After"] == "1"
        finally:
            await limiter.close()
    assert RATELIMIT_ERRORS._value.get() == errors + 2


async def test_the_memory_fast_path_answers_as_the_general_path() -> None:
    """``MemoryBackend.admit_now`` (plain arithmetic, every admitted call) gives the same headers, and
    refuses the same calls, as the general path (Buckets → ``take`` → states), call after call."""
    from billing.store import Principal
    from core.catalog import Catalog
    from core.wire import parse_chat_request
    from gateway.ratelimit import RateLimiter

    model = Catalog.load(None).resolve(MODEL)
    clock = [1000.0]
    settings = LimitsSettings(key_rpm=7, key_tpm=5000, group_rpm=9, group_tpm=4000)

    class GeneralOnly(MemoryBackend):
        def admit_now(self, plan: Any, tokens: int) -> None:
            return None  # (every check the general way: take)

    fast = RateLimiter(settings, MemoryBackend(clock=lambda: clock[0]))
    general = RateLimiter(settings, GeneralOnly(clock=lambda: clock[0]))
    who = [Principal(1, "a", 1, "g", None, None), Principal(2, "b", 1, "g", None, None)]
    outcomes = []
    for n in range(60):
        text = "x" * (n * 37 % 400)
        body = json.dumps(
            {"model": MODEL, "max_tokens": 50 + n % 5 * 100, "messages": [{"role": "user", "content": text}]}
        ).encode()
        _, req = parse_chat_request(body)
        answers = []
        for limiter in (fast, general):
            try:
                answers.append(await limiter.admit(who[n % 2], model, len(body), req))
            except RateLimited as exc:
                answers.append(("429", exc.message, sorted(exc.headers.items())))
        assert answers[0] == answers[1], n
        outcomes.append(answers[0][0] == "429")
        clock[0] += (n % 7) * 1.3
    assert any(outcomes) and not all(outcomes)  # both admissions and refusals were compared


# -- the gateway, one process, limits in memory -----------------------------------------------------
@pytest.fixture(scope="module")
def lstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("ratelimit")
    limits = LimitsSettings(
        key_rpm=2,
        group_rpm=3,
        groups={
            "tpm": GroupLimits(key_rpm=100, group_rpm=100, key_tpm=600),
            "open": GroupLimits(key_rpm=0, group_rpm=0),
        },
    )
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        limits=limits,
    )
    s = Stack(tmp, settings).start()
    yield s
    s.stop()


def _ask(client: openai.OpenAI, text: str, **kw: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **kw
    )


def _sent_upstream(stack: Stack, marker: str) -> int:
    return sum(1 for body in stack.emulator("openai").requests if marker in json.dumps(body))


def test_key_rpm_refuses_with_retry_after_and_sends_nothing_upstream(lstack: Stack) -> None:
    group = lstack.group(10)
    client = lstack.client(lstack.key(group=group))
    for left in ("1", "0"):
        raw = _ask(client, "hello")
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
        assert raw.headers["x-ratelimit-remaining-requests"] == left
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        assert "x-ratelimit-limit-tokens" not in raw.headers  # no token limit applies
        raw.parse()
    before = lstack.run(lstack.store.get_group(group))
    records = len(lstack.run(lstack.store.usage(group=group)))
    marker = f"refused-{secrets.token_hex(4)}"
    with pytest.raises(openai.RateLimitError) as info:
        _ask(client, marker)
    response = info.value.response
    assert response.status_code == 429
    assert info.value.code == "rate_limit_exceeded"
    assert "requests per minute" in info.value.message and "API key" in info.value.message
    assert 28 <= int(response.headers["retry-after"]) <= 30  # rpm 2: one request every 30 s
    assert int(response.headers["retry-after-ms"]) > 28_000
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.headers["x-ratelimit-limit-requests"] == "2"
    assert response.headers["x-request-id"]
    assert _sent_upstream(lstack, marker) == 0
    after = lstack.run(lstack.store.get_group(group))
    assert (after.balance, after.reserved) == (before.balance, before.reserved)  # nothing reserved
    refusal = lstack.run(lstack.store.usage(group=group))  # recorded as refused, not charged
    assert len(refusal) == records + 1
    assert (refusal[0].status, refusal[0].credits, refusal[0].error_code) == (
        "rejected",
        0,
        "rate_limit_exceeded",
    )


def test_group_rpm_is_shared_by_the_groups_keys(lstack: Stack) -> None:
    group = lstack.group(10)
    a, b = lstack.client(lstack.key(group=group)), lstack.client(lstack.key(group=group))
    _ask(a, "one").parse()
    assert _ask(a, "two").headers["x-ratelimit-remaining-requests"] == "0"  # the key's own is tighter
    raw = _ask(b, "three")  # group: 3rd of 3; key b: 1st of 2
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    assert raw.headers["x-ratelimit-limit-requests"] == "3"
    with pytest.raises(openai.RateLimitError) as info:
        _ask(b, "four")
    assert "group" in info.value.message
    assert 18 <= int(info.value.response.headers["retry-after"]) <= 20  # rpm 3: one request every 20 s


def test_token_limit_counts_the_worst_case_and_refuses_what_can_never_fit(lstack: Stack) -> None:
    client = lstack.client(lstack.key(group=lstack.group(10, name="tpm")))
    raw = _ask(client, "hi", max_tokens=100)
    assert raw.headers["x-ratelimit-limit-tokens"] == "600"
    spent = 600 - int(raw.headers["x-ratelimit-remaining-tokens"])
    assert spent > 100  # max_tokens plus the prompt's upper bound (its bytes)
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    raw.parse()
    calls = 1
    with pytest.raises(openai.RateLimitError) as info:
        while calls < 10:
            _ask(client, "hi", max_tokens=100).parse()
            calls += 1
    assert calls == 600 // spent
    assert "tokens per minute" in info.value.message
    assert int(info.value.response.headers["retry-after"]) >= 1
    other = lstack.client(lstack.key(group="tpm"))
    with pytest.raises(openai.RateLimitError) as info:
        _ask(other, "hi", max_tokens=700)
    assert "Request too large" in info.value.message
    assert "retry-after" not in info.value.response.headers  # waiting would not help
    assert info.value.response.headers["x-should-retry"] == "false"  # (the openai SDKs obey it)


def test_streams_carry_the_headers_and_unlimited_groups_none(lstack: Stack) -> None:
    client = lstack.client(lstack.key(group=lstack.group(10)))
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    ) as raw:
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"
        assert sum(1 for _ in raw.iter_lines()) > 0
    free = lstack.client(lstack.key(group=lstack.group(10, name="open")))
    for _ in range(4):
        raw = _ask(free, "hi")
        assert not [h for h in raw.headers if h.startswith("x-ratelimit")]
        raw.parse()


def test_headers_off_leaves_them_to_the_refusal(tmp_path: Path) -> None:
    """``[limits] headers = false``: admitted answers (plain and streamed) carry no x-ratelimit-*;
    the limits still apply, and the 429 still says where the caller stands."""
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        limits=LimitsSettings(key_rpm=2, headers=False),
    )
    s = Stack(tmp_path, settings).start()
    try:
        client = s.client(s.key(group=s.group(10)))
        raw = _ask(client, "hi")
        assert raw.headers["x-request-id"]
        assert not [h for h in raw.headers if h.startswith("x-ratelimit")]
        raw.parse()
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        ) as streamed:
            assert not [h for h in streamed.headers if h.startswith("x-ratelimit")]
            assert sum(1 for _ in streamed.iter_lines()) > 0
        with pytest.raises(openai.RateLimitError) as info:
            _ask(client, "third")
        assert info.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert info.value.response.headers["x-ratelimit-limit-requests"] == "2"
    finally:
        s.stop()


# -- two gateway processes sharing Redis -------------------------------------------------------------
class Emulators:
    """The five emulators on their own event loop in a thread (the gateways are subprocesses)."""

    def __init__(self) -> None:
        from emulators.registry import start_emulators

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="emulators", daemon=True)
        self.thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_emulators(), self.loop).result(30)

    def stop(self) -> None:
        from emulators.registry import stop_emulators

        asyncio.run_coroutine_threadsafe(stop_emulators(self.running), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _router(config: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--config", str(config), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def _chat(port: int, key: str, text: str) -> tuple[int, dict[str, str]]:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as exc:
        with exc:  # closes its connection
            exc.read()
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}


def _config(tmp: Path, emulators: Emulators, prefix: str, store_url: str) -> Path:
    lines = [
        "[store]",
        f'url = "{store_url}"',
        "",
        "[reliability]",
        "max_retries = 0",
        "",
        "[limits]",
        "key_rpm = 4",
        "group_rpm = 0",
        f'redis_url = "{REDIS_URL}"',
        f'redis_prefix = "{prefix}"',
        "",
        "[observability]",
        'log_format = "json"',
        "",
    ]
    for name, item in emulators.running.items():
        lines += [f"[providers.{name}]", f'base_url = "{item.base_url}"', f'api_key = "{item.api_key}"', ""]
    path = tmp / "router.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def shared_pg() -> Iterator[str]:
    """A fresh PostgreSQL database: two gateway replicas share a store through PostgreSQL (SQLite takes
    one gateway per file)."""
    name = f"router_rl_{secrets.token_hex(4)}"
    run_sync(pg_admin(ADMIN_URL, f"CREATE DATABASE {name}"))
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        run_sync(pg_admin(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def test_two_gateways_share_one_allowance_through_redis(
    tmp_path: Path, redis_prefix: str, shared_pg: str
) -> None:
    emulators = Emulators()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    try:
        config = _config(tmp_path, emulators, redis_prefix, shared_pg)
        _router(config, "groups", "create", "shared", "--credits", "100")
        key = _router(config, "keys", "create", "--group", "shared")
        assert key.startswith("sk-mr-v1-")
        ports = [free_port(), free_port()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTER_")}
        for n, port in enumerate(ports):
            log = (tmp_path / f"gateway{n}.log").open("wb")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for port, proc in zip(ports, procs, strict=True):
            wait_healthy(port, proc)
        marker = f"shared-{secrets.token_hex(4)}"
        results = [_chat(ports[n % 2], key, f"{marker} {n}") for n in range(7)]
        statuses = [status for status, _ in results]
        assert statuses == [200, 200, 200, 200, 429, 429, 429]  # key_rpm 4, whichever gateway answers
        remaining = [headers.get("x-ratelimit-remaining-requests") for _, headers in results]
        assert remaining == ["3", "2", "1", "0", "0", "0", "0"]  # one count across both processes
        assert all(13 <= int(h["retry-after"]) <= 15 for _, h in results[4:])  # rpm 4: one every 15 s
        upstream = emulators.running["openai"].emulator.requests
        assert sum(1 for body in upstream if marker in json.dumps(body)) == 4
        ids = {h["x-request-id"] for _, h in results}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in logs:
            log.close()
        emulators.stop()
    # each process wrote its own JSON access-log lines: request ids, never the key
    lines = []
    for n in range(2):
        for line in (tmp_path / f"gateway{n}.log").read_text().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
    access = [
        entry
        for entry in lines
        if entry.get("logger") == "router.access" and entry["path"].startswith("/v1/")
    ]
    assert {entry["request_id"] for entry in access} == ids
    assert sorted(entry["status"] for entry in access) == [200] * 4 + [429] * 3
    assert all(entry["key_id"] and entry["group"] == "shared" and entry["model"] == MODEL for entry in access)
    text = "\n".join((tmp_path / f"gateway{n}.log").read_text() for n in range(2))
    assert key not in text and key[-12:] not in text
