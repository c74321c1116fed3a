"""Every kind of upstream fault, through a real gateway and the OpenAI SDK, against an upstream of the
test's own that misbehaves at the TCP and HTTP level (the emulators' fault words cover the polite
failures; these are the rude ones). After each: the caller got the documented status (or, after the
stream began, the error event), exactly one usage record, and the group's balance moved by exactly
that record's credits: a failure that produced nothing costs nothing, a stream cut after some text is
billed for that text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from core.catalog import NANO
from core.config import ReliabilitySettings, Settings, StoreSettings
from core.deployments import Deployment
from tests.conftest import Stack, free_port, use_deployment

MODEL = "openai/gpt-4o-mini"
CHUNK = (
    'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":'
    '[{"index":0,"delta":{"role":"assistant","content":"Hello there, how are"},"finish_reason":null}]}\n\n'
)


class Rude:
    """An upstream that reads the request, then does what ``mode`` says."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.port = free_port()
        self.server: asyncio.AbstractServer | None = None
        self.handling: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.handling):
            task.cancel()
        await asyncio.gather(*self.handling, return_exceptions=True)
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handling.add(task)
        try:
            await self._answer(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:  # however it ended (a slow answer cancelled at the end included), the socket goes
            writer.transport.abort()
            self.handling.discard(task)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        mode = self.mode
        if mode == "reset":
            return
        if mode == "slow":
            await asyncio.sleep(3)
        if mode.startswith("status:"):
            status = int(mode.split(":")[1])
            body = json.dumps({"error": {"message": "upstream says no", "type": "server_error"}}).encode()
            extra = "retry-after: 2\r\n" if status == 429 else ""
            writer.write(
                f"HTTP/1.1 {status} X\r\nconnection: close\r\ncontent-type: application/json\r\n{extra}content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
        elif mode == "garbage":
            body = b"<html>502 bad gateway, from a proxy in the way</html>"
            writer.write(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                % (len(body), body)
            )
        elif mode == "cut-body":
            writer.write(
                b'HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 900\r\n\r\n{"id":"c1","obj'
            )
        elif mode == "cut-stream":
            writer.write(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: text/event-stream\r\n\r\n"
                + CHUNK.encode() * 2
            )
            await writer.drain()
            await asyncio.sleep(0.1)
            return
        await writer.drain()
        await asyncio.sleep(0.05)  # the answer is read before the connection goes


@pytest.fixture(scope="module")
def rude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Rude]]:
    tmp: Path = tmp_path_factory.mktemp("rude")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9, first_byte_timeout=1.0),
    )
    stack = Stack(tmp, settings).start()
    upstream = Rude()
    stack.run(upstream.start())
    use_deployment(stack.gateway, Deployment("openai", f"http://127.0.0.1:{upstream.port}/v1", "k", 2, 5))
    try:
        yield stack, upstream
    finally:
        stack.run(upstream.stop())
        stack.stop()


def _ledger(stack: Stack, group: str) -> tuple[int, list[tuple[str, int, str | None]]]:
    """(what the group has spent, its usage records: status, credits, error code)."""
    info = stack.run(stack.store.get_group(group))
    assert info is not None and info.reserved == 0
    rows = stack.run(
        stack.store.database.select(
            "SELECT u.status, u.credits, u.error_code FROM usage u JOIN groups g ON g.id = u.group_id WHERE g.name = ?",
            (group,),
        )
    )
    assert info.spent == 100 * NANO - info.balance
    return info.spent, [(r[0], r[1], r[2]) for r in rows]


# the upstream said 200 and then failed: a stream has begun by then (its error is an event), a JSON
# answer has not (its error is the status)
AFTER_HEADERS = {"garbage", "cut-body"}
FAULTS = [  # mode, status the caller gets, error code
    ("refused", 503, "upstream_unavailable"),
    ("reset", 502, "upstream_error"),
    ("status:500", 502, "upstream_error"),
    ("status:502", 503, "upstream_unavailable"),
    ("status:503", 503, "upstream_unavailable"),
    ("status:529", 503, "upstream_unavailable"),
    ("status:429", 429, "rate_limit_exceeded"),
    ("garbage", 502, "upstream_error"),
    ("cut-body", 502, "upstream_error"),
    ("slow", 504, "upstream_timeout"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("mode", "status", "code"), FAULTS, ids=[f[0] for f in FAULTS])
def test_an_upstream_fault_before_any_text_is_its_documented_error_and_costs_nothing(
    rude: tuple[Stack, Rude], mode: str, status: int, code: str, stream: bool
) -> None:
    stack, upstream = rude
    if mode == "refused":
        use_deployment(stack.gateway, Deployment("openai", f"http://127.0.0.1:{free_port()}/v1", "k", 2, 5))
    upstream.mode = mode
    group = stack.group(100)
    client = stack.client(stack.key(group=group))
    try:
        if stream and mode in AFTER_HEADERS:
            with pytest.raises(openai.APIError) as event:  # the stream's error event, then [DONE]
                list(
                    client.chat.completions.create(
                        model=MODEL, stream=True, messages=[{"role": "user", "content": "hi"}]
                    )
                )
            assert "provider 'openai'" in event.value.message
        else:
            with pytest.raises(openai.APIStatusError) as info:
                out = client.chat.completions.create(
                    model=MODEL, stream=stream, messages=[{"role": "user", "content": "hi"}]
                )
                if stream:
                    list(out)  # type: ignore[arg-type]
            assert info.value.status_code == status, info.value.message
            assert info.value.body["code"] == code  # type: ignore[index]
            if status == 429:
                assert info.value.response.headers["retry-after"] == "2"
    finally:
        if mode == "refused":
            use_deployment(
                stack.gateway, Deployment("openai", f"http://127.0.0.1:{upstream.port}/v1", "k", 2, 5)
            )
    spent, records = _ledger(stack, group)
    assert spent == 0 and [(s, c) for s, c, _ in records] == [("error", 0)]


def test_a_stream_cut_after_some_text_ends_with_an_error_event_and_bills_that_text(
    rude: tuple[Stack, Rude],
) -> None:
    stack, upstream = rude
    upstream.mode = "cut-stream"
    group = stack.group(100)
    client = stack.client(stack.key(group=group))
    text = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(
            model=MODEL, stream=True, messages=[{"role": "user", "content": "hi"}]
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
    assert "".join(text) == "Hello there, how are" * 2
    assert "provider 'openai'" in info.value.message
    spent, records = _ledger(stack, group)
    assert len(records) == 1 and records[0][0] in ("error", "interrupted")
    assert spent == records[0][1] > 0  # the text generated before the cut is billed (estimated)
