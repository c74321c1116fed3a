"""router/replies.py's LateSSE on its own: the response start always goes out before any of its
body, whenever the upstream answers relative to the keep-alive timer (the same loop turn included)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from typing import Any

from core.types import RECEIVE_WATCH
from router.replies import KEEPALIVE, LateSSE
from server.channels import Channel


async def _one(keepalive: float, answer_after: float) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    answered = loop.create_future()
    loop.call_later(answer_after, answered.set_result, None)  # (registered before the response's own timer)

    async def stream() -> AsyncGenerator[Any, None]:
        await answered
        yield [(b"x-extra", b"1")]
        yield b"data: hi\n\n"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    response = LateSSE(stream(), keepalive, lambda exc: b"")
    await response({"type": "http"}, receive, send)
    return sent


async def test_the_response_starts_before_its_body_however_the_answer_and_the_keepalive_meet() -> None:
    rng = random.Random(7)
    for _ in range(300):
        keepalive = 0.002
        sent = await _one(keepalive, keepalive + rng.choice([0.0, 0.0, 0.0, -0.0002, 0.0002]))
        kinds = [m["type"] for m in sent]
        assert kinds[0] == "http.response.start", kinds
        assert kinds.count("http.response.start") == 1, kinds
        bodies = [m["body"] for m in sent[1:]]
        assert bodies[-1] == b"" and b"data: hi\n\n" in bodies, bodies
        assert all(b in (KEEPALIVE, b"data: hi\n\n", b"") for b in bodies), bodies
        if KEEPALIVE in bodies:  # started early: without the headers the stream's first item carries
            assert (b"x-extra", b"1") not in sent[0]["headers"]


async def _disconnected(receive_from: str) -> tuple[list[bytes], bool]:
    """An endless stream whose caller disconnects after the third piece: the response returns, the
    stream closed (its finally ran), whether the scope offers the channel's watch (no task waits on
    ``receive``) or not (a task waits on it)."""
    closed = False

    async def stream() -> AsyncGenerator[Any, None]:
        nonlocal closed
        yield []
        try:
            n = 0
            while True:
                n += 1
                yield b"data: %d\n\n" % n
                await asyncio.sleep(0.01)
        finally:
            closed = True

    channel = Channel()
    await channel.put({"type": "http.request", "body": b"", "more_body": False})
    await channel.get()  # (the request's body, read before the response begins)
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message.get("body"):
            sent.append(message["body"])
            if len(sent) == 3:
                asyncio.get_running_loop().call_soon(
                    asyncio.ensure_future, channel.put({"type": "http.disconnect"})
                )

    async def plain_receive() -> Any:
        return await channel.get()

    receive = channel.get if receive_from == "channel" else plain_receive
    scope = {
        "type": "http",
        "extensions": {RECEIVE_WATCH: {"watch": channel.watch}} if receive_from == "channel" else {},
    }
    await asyncio.wait_for(LateSSE(stream(), 10.0, lambda exc: b"")(scope, receive, send), 5)
    return sent, closed


async def test_a_disconnect_ends_the_stream_at_once_whatever_receive_is() -> None:
    for receive_from in ("channel", "function"):
        sent, closed = await _disconnected(receive_from)
        assert closed, receive_from
        assert 3 <= len(sent) <= 4, (receive_from, sent)
