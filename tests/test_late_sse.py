"""router/replies.py's LateSSE on its own: the response start always goes out before any of its
body, whenever the upstream answers relative to the keep-alive timer (the same loop turn included)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from typing import Any

from router.replies import KEEPALIVE, LateSSE


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
