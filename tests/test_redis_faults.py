"""Redis stopped under a running gateway, then started again: a redis-server of the test's own (never
the shared one), a real gateway whose rate limits and deployment state live in it."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from core.config import LimitsSettings, ReliabilitySettings, Settings, StoreSettings
from core.metrics import RATELIMIT_ERRORS
from gateway.ratelimit import Bucket
from gateway.ratelimit_redis import RedisBackend
from tests.conftest import Stack, free_port


class RedisServer:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (
                subprocess.run(
                    ["redis-cli", "-p", str(self.port), "ping"], capture_output=True
                ).stdout.strip()
                == b"PONG"
            ):
                return
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def limited(tmp_path: Path, redis_server: RedisServer, **limits: int) -> Settings:
    """A gateway's settings with ``limits`` kept in the test's own Redis (a short timeout)."""
    return Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        limits=LimitsSettings(
            redis_url=redis_server.url, redis_timeout=0.2, redis_prefix=f"t{redis_server.port}:", **limits
        ),
    )


def test_rate_limits_fail_open_while_redis_is_down_and_hold_again_once_it_is_back(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """While Redis is down every call is answered (admitted unchecked: [limits] fail_open, the default),
    each one counted in router_ratelimit_backend_errors_total and logged at most every 10 s; no 5xx.
    Once Redis is back the limits hold again, with a fresh window (Redis kept nothing on disk)."""
    stack = Stack(tmp_path, limited(tmp_path, redis_server, key_rpm=3)).start()
    try:
        client = stack.client()
        ask = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            client.chat.completions.create(**ask)  # type: ignore[call-overload]
        with pytest.raises(openai.RateLimitError):  # the limit is counted in Redis
            client.chat.completions.create(**ask)  # type: ignore[call-overload]

        redis_server.kill()
        errors = RATELIMIT_ERRORS._value.get()
        answered = [client.chat.completions.create(**ask).choices[0].message.content for _ in range(6)]  # type: ignore[call-overload]
        assert all(answered)  # over the limit, and served: the limits cannot be checked
        assert RATELIMIT_ERRORS._value.get() >= errors + 6

        redis_server.start()  # the same port, empty
        deadline = time.monotonic() + 10
        while True:  # the client reconnects on its next command
            try:
                for _ in range(4):
                    client.chat.completions.create(**ask)  # type: ignore[call-overload]
            except openai.RateLimitError:
                break
            assert time.monotonic() < deadline, "the limits never held again after Redis came back"
        records = stack.run(stack.store.database.select("SELECT status, COUNT(*) FROM usage GROUP BY status"))
        counts = dict(records)
        assert counts.get("ok", 0) >= 3 + 6 + 3 and counts.get("error", 0) == 0
    finally:
        stack.stop()


async def test_a_round_trip_cut_off_by_its_timeout_leaves_no_reply_for_the_next_calls(
    redis_server: RedisServer,
) -> None:
    """Redis stalls (CLIENT PAUSE on the test's own server) past a check's timeout: that check fails,
    and the connection it was sent on is closed, so its reply (which Redis would send once the pause
    ends) never reaches a later check: each later check gets its own bucket's answer."""
    prefix = f"t{redis_server.port}:"
    backend = RedisBackend(redis_server.url, prefix, timeout=0.25)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        ok, [state] = await backend.take([Bucket(prefix + "a", 10, 1)])
        assert ok and state.remaining == 9
        admin.execute_command("CLIENT", "PAUSE", "800", "ALL")
        with pytest.raises(Exception):  # noqa: B017 (the timeout, as redis or asyncio raises it)
            await backend.take([Bucket(prefix + "stalled", 100, 1)])
        await asyncio.sleep(1.0)  # the pause is over
        for n, limit in enumerate((5, 7, 9)):
            ok, [state] = await backend.take([Bucket(prefix + f"later{n}", limit, 1)])
            assert ok and state.remaining == limit - 1  # a stalled reply would say 99
    finally:
        admin.close()
        await backend.close()


def test_calls_in_flight_fail_open_while_redis_is_down_and_count_again_once_it_is_back(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A key allowed one call in flight (gateway/concurrency.py), its count in a Redis that dies while a
    stream holds the place: the stream ends normally (its place cannot be given back: logged, left to
    the lease), calls meanwhile are admitted uncounted, none gets a 5xx; once Redis is back (empty) the
    count holds again."""
    stack = Stack(tmp_path, limited(tmp_path, redis_server, key_concurrent=1)).start()
    try:
        client = stack.client()
        ask = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        slow = {**ask, "messages": [{"role": "user", "content": "[tokens:12] [delay:100]"}], "stream": True}
        held = client.chat.completions.create(**slow)  # type: ignore[call-overload]
        chunks = iter(held)
        next(chunks)
        with pytest.raises(openai.RateLimitError):  # the place is counted in Redis
            client.chat.completions.create(**ask)  # type: ignore[call-overload]

        redis_server.kill()
        answered = [client.chat.completions.create(**ask).choices[0].message.content for _ in range(3)]  # type: ignore[call-overload]
        assert all(answered)  # admitted uncounted: the count cannot be read
        assert [
            c for c in chunks if c.choices and c.choices[0].finish_reason
        ]  # the held stream ends normally

        redis_server.start()  # the same port, empty
        deadline = time.monotonic() + 10
        while True:  # the client reconnects on its next command
            again = client.chat.completions.create(**slow)  # type: ignore[call-overload]
            first = iter(again)
            next(first)
            try:
                client.chat.completions.create(**ask)  # type: ignore[call-overload]
            except openai.RateLimitError as exc:
                assert exc.code == "concurrency_limit_exceeded"
                break
            finally:
                again.close()
            assert time.monotonic() < deadline, "the count never held again after Redis came back"
        records = dict(
            stack.run(stack.store.database.select("SELECT status, COUNT(*) FROM usage GROUP BY status"))
        )
        assert records.get("error", 0) == 0
    finally:
        stack.close_clients()
        stack.stop()


def test_calls_that_end_while_redis_is_frozen_give_their_places_back_when_it_answers(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A key allowed two calls in flight, both taken by streams; Redis freezes (CLIENT PAUSE on the
    test's own server, longer than the backend's timeout) and both streams end meanwhile: their
    releases fail. They were left to their 60 s lease, and the key was refused (429) for a minute;
    now they are sent again with the next check once Redis answers, so two new calls get in at once."""
    stack = Stack(tmp_path, limited(tmp_path, redis_server, key_concurrent=2)).start()
    admin = redis.Redis.from_url(redis_server.url)
    try:
        client = stack.client()

        def slow() -> Any:
            return client.chat.completions.create(
                model="openai/gpt-4o-mini",
                stream=True,
                messages=[{"role": "user", "content": "[tokens:3] [delay:150]"}],
            )

        streams = [iter(slow()) for _ in range(2)]
        for chunks in streams:
            next(chunks)  # both places taken, in Redis
        with pytest.raises(openai.RateLimitError):
            slow()

        frozen = time.monotonic()
        admin.execute_command("CLIENT", "PAUSE", "2500", "ALL")
        for chunks in streams:  # the streams end while Redis answers nothing
            assert [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert time.monotonic() - frozen < 2.0
        time.sleep(max(frozen + 2.8 - time.monotonic(), 0))  # Redis answers again

        again = [slow() for _ in range(2)]
        for stream in again:  # both admitted: the two ended calls hold no place any more
            assert next(iter(stream)).choices
        for stream in again:
            stream.close()
    finally:
        admin.close()
        stack.close_clients()
        stack.stop()
