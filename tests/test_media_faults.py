"""Embeddings and images under a store fault, through the real server and a real SQLite store: the
same guarantees as chat (tests/test_faults.py). While another process holds the write lock past the
gateway's busy timeout, a call is answered (its settlement journaled, replayed once the lock is
gone) or refused with 503 ``store_unavailable`` (Retry-After); afterwards every answered call is charged once, the records add up to what left the balance, and no
hold is left."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import openai

from billing.sqlite_thread import BUSY_TIMEOUT_MS
from core.catalog import NANO
from core.config import ReliabilitySettings, Settings, StoreSettings
from tests.conftest import Stack
from tests.test_faults import HOLD_LOCK, Tally, books, check_books, counter


async def media_call(client: openai.AsyncOpenAI, n: int) -> str:
    try:
        if n % 2:
            answer = await client.embeddings.create(
                model="openai/text-embedding-3-small", input=[f"text {n}", "more"]
            )
            assert len(answer.data) == 2
        else:
            image = await client.images.generate(
                model="google/imagen-4.0-fast-generate-001", prompt=f"dot {n}"
            )
            assert image.data
        return "ok"
    except openai.APIStatusError as exc:
        if exc.status_code == 503 and exc.code == "store_unavailable":  # type: ignore[attr-defined]
            assert exc.response.headers.get("retry-after")
            return "store_unavailable"
        return f"{exc.status_code} {exc.code}"  # type: ignore[attr-defined]


def test_embeddings_and_images_when_the_sqlite_store_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "router.db"
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{path}", journal=str(tmp_path / "journal.jsonl")),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        group = stack.group(1_000)
        key = stack.key(group=group)
        tally = Tally()
        hold = BUSY_TIMEOUT_MS / 1000 + 2
        journaled = counter("router_settlements_journaled_total")

        async def scenario() -> None:
            client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)
            stop = asyncio.Event()

            async def worker(first: int) -> None:
                n = first
                while not stop.is_set():
                    tally.add(await media_call(client, n))
                    n += 4

            workers = [asyncio.ensure_future(worker(i)) for i in range(4)]
            await asyncio.sleep(0.5)
            locker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLD_LOCK, str(path), str(hold), stdout=subprocess.PIPE
            )
            assert locker.stdout is not None
            assert (await locker.stdout.readline()).strip() == b"locked"
            await locker.wait()
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*workers)
            await client.close()

        asyncio.run(scenario())
        for _ in range(100):
            stack.run(stack.gateway.ledger.drain(), timeout=60)
            if not stack.gateway.ledger.durable.journal.count:
                break
            time.sleep(0.1)
        balance, reserved, spent, records = stack.run(books(f"sqlite:///{path}", group))
        figures = check_books(1_000 * NANO, tally, balance, reserved, spent, records)
        went = counter("router_settlements_journaled_total") - journaled
        print(f"\nembeddings and images, sqlite lock held {hold:g} s: {figures}; journaled {went:g}")
        assert tally.ok > 0 and went > 0 and {r.endpoint for r in records} == {"embeddings", "images"}
    finally:
        stack.stop()
