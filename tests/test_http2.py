"""Callers over HTTP/2 (cleartext, prior knowledge: what a proxy or a service mesh in front of the
gateway speaks): the OpenAI SDK on an HTTP/2 httpx client gets the answers HTTP/1.1 gets, many streams
share one connection, and a stream the caller resets mid-answer stops its upstream and is billed
once, while the other streams of its connection go on."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai

from tests.conftest import Stack, h2_chat, h2_exchange

HI: Any = [{"role": "user", "content": "Say something [tokens:12]"}]


def streamed_text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def calls(stack: Stack, key: str, http2: bool) -> tuple[str, list[str], list[Any], str]:
    transport = httpx.AsyncClient(http1=not http2, http2=http2)
    async with openai.AsyncOpenAI(
        base_url=stack.base_url, api_key=key, max_retries=0, http_client=transport
    ) as client:
        raw = await client.chat.completions.with_raw_response.create(model="openai/gpt-4o-mini", messages=HI)
        whole = raw.parse().choices[0].message.content or ""

        async def one() -> list[Any]:
            stream = await client.chat.completions.create(
                model="openai/gpt-4o-mini", messages=HI, stream=True, stream_options={"include_usage": True}
            )
            return [chunk async for chunk in stream]

        streams = await asyncio.gather(*(one() for _ in range(10)))
        return (
            whole,
            [streamed_text(s) for s in streams],
            [s[-1].usage for s in streams],
            raw.http_response.http_version,
        )


def test_the_openai_sdk_over_http2_gets_what_http1_gets(stack: Stack) -> None:
    key = stack.key(10)
    whole, texts, usages, version = asyncio.run(calls(stack, key, http2=True))
    whole1, texts1, usages1, version1 = asyncio.run(calls(stack, key, http2=False))
    assert (version, version1) == ("HTTP/2", "HTTP/1.1")
    assert whole == whole1 and whole
    assert texts == texts1 == [whole] * 10  # ten streams multiplexed on one connection, each whole
    assert all(u is not None and u.completion_tokens == 12 for u in usages) and usages == usages1


def test_a_reset_stream_stops_its_upstream_and_is_billed_once(stack: Stack) -> None:
    group = stack.group(10)
    key = stack.key(group=group)
    emulator = stack.emulator("openai")

    def request(content: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
        body = json.dumps(
            {
                "model": "openai/gpt-4o-mini",
                "stream": True,
                "messages": [{"role": "user", "content": content}],
            }
        ).encode()
        return h2_chat(key), body

    async def exchange() -> list[tuple[int, bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        try:
            requests = [
                request("long [tokens:200] [delay:50]"),
                request("short [tokens:20] [delay:20]"),
                request("short [tokens:20] [delay:20]"),
            ]
            return await h2_exchange(reader, writer, requests, cancel={0: 3})
        finally:
            writer.close()

    reset_at = time.monotonic()
    answers = asyncio.run(exchange())
    assert [status for status, _ in answers] == [200, 200, 200]
    for _, body in answers[1:]:
        assert body.rstrip().endswith(b"data: [DONE]")  # the connection's other streams went on to the end
    deadline = time.monotonic() + 5  # (the emulator keeps its last 50 streams: this test's are the last 3)
    while sorted(o for o, _ in emulator.streams[-3:]) != ["complete", "complete", "disconnected"]:
        assert time.monotonic() < deadline, emulator.streams[-3:]
        time.sleep(0.02)
    cut = [events for outcome, events in emulator.streams[-3:] if outcome == "disconnected"]
    assert cut[0] < 40  # of ~200 events: dropped within a few 50 ms gaps of the reset
    assert time.monotonic() - reset_at < 8
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert len(records) == 3 and all(r.credits > 0 for r in records)  # the reset one too: what it used
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == sum(r.credits for r in records) and g.reserved == 0
