"""A bounded soak on loopback: thousands of streamed calls through one gateway process, memory flat."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.conftest import Stack, free_port
from tests.test_crash import _cli, _config_with_key, _serve


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _load(port: int, key: str, calls: int, concurrency: int = 32) -> int:
    body = (
        b'{"model":"openai/gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},'
        b'"messages":[{"role":"user","content":"soak [tokens:8]"}]}'
    )
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    done = 0
    left = iter(range(calls))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        for _ in left:
            async with session.post(url, data=body, headers=headers) as r:
                text = await r.read()
                assert r.status == 200 and text.endswith(b"data: [DONE]\n\n")
                done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done


def test_memory_stays_flat_over_thousands_of_streams(stack: Stack, tmp_path: Path) -> None:
    config, key = _config_with_key(
        tmp_path, f"sqlite:///{tmp_path}/soak.db", stack.emulators["openai"], "soak", 1000
    )
    port = free_port()
    proc = _serve(config, port)
    try:
        assert asyncio.run(_load(port, key, 1500)) == 1500  # warm-up: caches, pools, allocator
        before = _rss_kib(proc.pid)
        assert asyncio.run(_load(port, key, 4000)) == 4000
        after = _rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(20)
    growth = after - before
    print(f"RSS before {before} KiB, after 4000 more streams {after} KiB, growth {growth} KiB")
    assert growth < 12 * 1024, f"memory grew by {growth} KiB over 4000 streams"
    usage = _cli(config, "groups", "show", "soak")
    assert "reserved  0 credits" in usage
