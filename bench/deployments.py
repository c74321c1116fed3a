"""Deployments benchmark: what pooling a provider's accounts buys. Three emulated OpenAI deployments,
each limited to R requests a minute (the emulator answers 429 with Retry-After beyond it), behind one
gateway, against the same gateway with one such deployment; offered load 2.5 R a minute, open loop
(calls arrive at a fixed rate whatever the answers), for ``--seconds``.

    .venv/bin/python -m bench.deployments [--seconds 30] [--rpm 240]

Rows: one deployment (the baseline); three, their ceilings declared to the gateway (``rpm = R``,
routing ``usage``); three, ceilings not declared (the gateway learns them from the 429s and cools the
deployment down for its Retry-After). Per row: calls served per minute, 429s the callers saw (per
minute and in all), other errors, and the 429s the upstreams answered (the gateway's, hidden from the
callers by moving the call to another deployment). The gateway runs with its default reliability
settings (up to 2 retries within the call's deadline), one process, SQLite, in this process with the
emulators and the load on one event loop (the load is light: a few calls a second).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from typing import Any

import aiohttp

from billing.backends import open_store
from core.catalog import NANO
from core.config import ServerSettings, Settings, StoreSettings, parse_settings
from emulators.common import serve
from emulators.openai import OpenAIEmulator
from gateway.auth import new_key
from router.app import create_app
from server.serve import hypercorn_config

ROWS = (
    ("1 deployment", 1, False),
    ("3 deployments, ceilings declared", 3, True),
    ("3 deployments, ceilings learned from 429s", 3, False),
)
OFFERED = 2.5  # offered load, in R


def settings(tmp: str, urls: list[str], rpm: int, declared: bool) -> Settings:
    items = [
        {"name": f"d{i + 1}", "base_url": url, "api_key": f"bench-{i}", "rpm": rpm if declared else 0}
        for i, url in enumerate(urls)
    ]
    routing = "usage" if declared else "simple-shuffle"
    raw = {
        "store": {"url": f"sqlite:///{tmp}/router.db"},
        "observability": {"access_log": False, "log_format": "none"},
        "providers": {"openai": {"deployments": items, "routing": routing}},
    }
    parsed = parse_settings(raw, "bench")
    return Settings(
        store=StoreSettings(url=parsed.store.url),
        observability=parsed.observability,
        providers=parsed.providers,
    )


async def one_row(count: int, declared: bool, rpm: int, seconds: float) -> dict[str, Any]:
    from hypercorn.asyncio import serve as hypercorn_serve

    emulators = [OpenAIEmulator("openai", f"bench-{i}", rpm=rpm) for i in range(count)]
    runners = []
    urls = []
    for emulator in emulators:
        runner, port = await serve(emulator.app)
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}/v1")
    with tempfile.TemporaryDirectory(prefix="bench-deployments-") as tmp:
        config = settings(tmp, urls, rpm, declared)
        store = open_store(config.store.url)
        await store.open()
        await store.create_group("bench", 10**6 * NANO)
        key, _ = await new_key(store, config, "bench", "bench")
        await store.close()
        app = create_app(config)
        stop = asyncio.Event()
        sock_port = await _free_port()
        hc = hypercorn_config(ServerSettings(port=sock_port))
        hc.errorlog = None
        served_task = asyncio.ensure_future(hypercorn_serve(app, hc, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        try:
            await _wait_port(sock_port)
            outcome = await offer(
                f"http://127.0.0.1:{sock_port}/v1/chat/completions", key, OFFERED * rpm / 60, seconds
            )
        finally:
            stop.set()
            await served_task
            for runner in runners:
                await runner.cleanup()
    minutes = seconds / 60
    return {
        "deployments": count,
        "declared": declared,
        "offered_per_minute": round(OFFERED * rpm),
        "served_per_minute": round(outcome["ok"] / minutes, 1),
        "caller_429_per_minute": round(outcome["429"] / minutes, 1),
        "calls": outcome["calls"],
        "served": outcome["ok"],
        "caller_429": outcome["429"],
        "other_errors": outcome["other"],
        "upstream_429": sum(e.refused for e in emulators),
        "upstream_served": [e.served for e in emulators],
    }


async def offer(url: str, key: str, per_second: float, seconds: float) -> dict[str, int]:
    """Calls at a fixed rate (open loop) for ``seconds``, then every answer awaited."""
    counts = {"calls": 0, "ok": 0, "429": 0, "other": 0}
    body = {
        "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hello [tokens:4]"}],
        "max_tokens": 8,
    }
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:

        async def call() -> None:
            async with session.post(url, json=body) as response:
                await response.read()
                counts["ok" if response.status == 200 else "429" if response.status == 429 else "other"] += 1

        tasks = []
        start = time.monotonic()
        n = int(per_second * seconds)
        for i in range(n):
            delay = start + i / per_second - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(call()))
            counts["calls"] += 1
        await asyncio.gather(*tasks, return_exceptions=True)
    return counts


async def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_port(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            await asyncio.sleep(0.02)
    raise RuntimeError("the gateway did not start")


async def run_all(seconds: float, rpm: int) -> dict[str, Any]:
    rows = {}
    for name, count, declared in ROWS:
        rows[name] = await one_row(count, declared, rpm, seconds)
    return {"rpm": rpm, "seconds": seconds, "rows": rows}


def run(seconds: float = 30.0, rpm: int = 240) -> dict[str, Any]:
    """Every row, ``seconds`` each; call it outside any running event loop."""
    return asyncio.run(run_all(seconds, rpm))


def report(result: dict[str, Any]) -> str:
    rpm = result["rpm"]
    lines = [
        f"deployments benchmark: each deployment an emulator limited to R = {rpm} RPM; offered "
        f"{OFFERED:g} R = {OFFERED * rpm:g} calls/min for {result['seconds']:g} s (open loop)",
        f"  {'':<42} {'served/min':>10} {'429s/min':>9} {'429s':>5} {'errors':>6} {'upstream 429s':>13}",
    ]
    for name, r in result["rows"].items():
        lines.append(
            f"  {name:<42} {r['served_per_minute']:>10,.1f} {r['caller_429_per_minute']:>9,.1f} "
            f"{r['caller_429']:>5} {r['other_errors']:>6} {r['upstream_429']:>13}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.deployments", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="offered load duration per row")
    p.add_argument("--rpm", type=int, default=240, help="R: each deployment's requests per minute")
    args = p.parse_args(argv)
    print(report(run(args.seconds, args.rpm)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
