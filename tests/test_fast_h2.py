"""server.fast_h2 against hypercorn's own HTTP/2 sending, through a real hypercorn and a real HTTP/2
client (the h2 library): the same bytes in the same order on concurrent streams, whether a chunk goes
at once, waits for the client's flow-control window, or lands behind others already waiting."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypercorn.protocol.h2 import H2Protocol

from server import fast_h2
from tests.conftest import h2_exchange, h2_get, hypercorn_on


def chunk(stream: int, index: int, size: int) -> bytes:
    return bytes([(stream * 7 + index) % 256]) * size  # neighbours differ: a reordering shows


def plans(seed: int, streams: int) -> dict[str, list[int]]:
    """Chunk sizes per request path: mostly SSE-sized, some empty, some over one frame (16 KB)."""
    rng = random.Random(seed)
    sizes = [0, 1, 40, 300, 900, 5_000, 16_384, 16_385, 40_000]
    weights = [1, 3, 10, 10, 4, 2, 1, 1, 1]
    return {f"/s{i}": rng.choices(sizes, weights, k=rng.randint(5, 60)) for i in range(streams)}


def chunked_app(plan: dict[str, list[int]]) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        sizes = plan[scope["path"]]
        stream = int(scope["path"][2:])
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for index, size in enumerate(sizes):
            await send({"type": "http.response.body", "body": chunk(stream, index, size), "more_body": True})
            if index % 3 == 0:
                await asyncio.sleep(0)  # other streams' chunks come between this one's
        await send({"type": "http.response.body", "body": b""})

    return app


async def fetch_all(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    paths: list[str],
    window: int,
    cancel: str | None = None,
) -> dict[str, bytes]:
    """Each path on its own stream of one connection (``cancel``: that one reset after its first data)."""
    cancels = {paths.index(cancel): 1} if cancel else {}
    answers = await h2_exchange(reader, writer, [(h2_get(p), None) for p in paths], window, cancels)
    for status, _ in answers:
        assert status == 200
    return {path: body for path, (_, body) in zip(paths, answers, strict=True)}


def expected(plan: dict[str, list[int]]) -> dict[str, bytes]:
    return {
        path: b"".join(chunk(int(path[2:]), i, size) for i, size in enumerate(sizes))
        for path, sizes in plan.items()
    }


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many body chunks fell through to hypercorn's own sending."""
    seen = {"hypercorn": 0}
    original = fast_h2.ORIGINAL_STREAM_SEND

    async def counting(self: Any, event: Any) -> None:
        seen["hypercorn"] += type(event).__name__ == "Body"
        await original(self, event)

    monkeypatch.setattr(fast_h2, "ORIGINAL_STREAM_SEND", counting)
    return seen


@pytest.mark.parametrize("window", [65_535, 3_000, 2**24])
@pytest.mark.parametrize("seed", range(4))
async def test_the_same_bytes_in_order_as_hypercorns_own(
    seed: int, window: int, counted: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plans(seed, streams=8)
    paths = list(plan)
    monkeypatch.setattr(H2Protocol, "stream_send", fast_h2.stream_send)
    async with hypercorn_on(chunked_app(plan)) as (reader, writer):
        fast = await fetch_all(reader, writer, paths, window)
    chunks = sum(len(sizes) for sizes in plan.values())
    assert fast == expected(plan)
    # both ways were taken: a chunk sent at once, and one that waited (for the window, or as over a frame)
    assert 0 < counted["hypercorn"] < chunks

    monkeypatch.setattr(H2Protocol, "stream_send", fast_h2.ORIGINAL_STREAM_SEND)
    async with hypercorn_on(chunked_app(plan)) as (reader, writer):
        own = await fetch_all(reader, writer, paths, window)
    assert own == fast


async def test_a_reset_stream_ends_its_app_and_spares_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(H2Protocol, "stream_send", fast_h2.stream_send)
    plan = {f"/s{i}": [40] * 200 for i in range(4)}
    disconnected: list[str] = []

    async def slow(scope: dict, receive: Any, send: Any) -> None:
        if scope["path"] == "/s1":  # the one the client cancels: it keeps streaming until told
            assert (await receive())["type"] == "http.request"
            gone = asyncio.ensure_future(receive())
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for index in range(5_000):
                await send({"type": "http.response.body", "body": chunk(1, index, 40), "more_body": True})
                await asyncio.sleep(0.001)
                if gone.done():
                    disconnected.append(gone.result()["type"])
                    return
            raise AssertionError("never told of the reset")
        await chunked_app(plan)(scope, receive, send)

    async with hypercorn_on(slow) as (reader, writer):
        got = await fetch_all(reader, writer, list(plan), 65_535, cancel="/s1")
    assert disconnected == ["http.disconnect"]
    want = expected(plan)
    assert {p: got[p] for p in plan if p != "/s1"} == {p: want[p] for p in plan if p != "/s1"}


@pytest.mark.slow  # (seconds of its own: not in make test-fast)
async def test_nothing_is_written_once_the_connection_is_gone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Apps that keep streaming after their caller's connection dropped (no reset, no GOAWAY: the
    socket closed) have their chunks dropped, as hypercorn's own sending task drops them, instead of
    written to the closed socket (asyncio warns after five such writes)."""
    monkeypatch.setattr(H2Protocol, "stream_send", fast_h2.stream_send)
    sent = [0]

    async def deaf(scope: dict, receive: Any, send: Any) -> None:  # streams on without listening
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for index in range(150):
            await send({"type": "http.response.body", "body": chunk(2, index, 40), "more_body": True})
            sent[0] += 1
            await asyncio.sleep(0.002)
        await send({"type": "http.response.body", "body": b""})

    paths = [f"/s{i}" for i in range(6)]
    async with hypercorn_on(deaf) as (reader, writer):
        with pytest.raises((AssertionError, ConnectionError, TimeoutError)):
            await h2_exchange(reader, writer, [(h2_get(p), None) for p in paths], cancel_connection_after=20)
        await asyncio.sleep(0.6)
    assert sent[0] > 100  # the client took 20 chunks before it dropped the connection: the apps went on
    assert not [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
