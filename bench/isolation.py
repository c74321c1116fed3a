"""One group's burst against another group's calls, with the default configuration (no limits set).

    .venv/bin/python -m bench.isolation [--burst 1000] [--calls 200]

The emulators and the gateway (SQLite, no rate or concurrency limits: the defaults) run as their own
processes. Group B makes ``--calls`` ordinary calls one after another, one every 25 ms (12 tokens, non-stream),
while ``/healthz`` is probed every 20 ms: first quiet, then while group A, from a client process of its own,
opens ``--burst`` slow streams at once (each waits 2 s for its first byte, then 40 tokens 50 ms apart).
Reported: B's latency and ``/healthz``'s, p50 and p99, quiet and under the burst, and how A's streams
ended. The budget (docs/operations.md, "Tenant isolation"): B's p99 under the burst within 1.5x what
``--direct`` gives on the same machine in the same run (``--rounds``), ``/healthz`` p99 under 50 ms.
Results: bench/results/isolation.json.

``--direct``: the same burst sent to the emulator itself, not through the gateway: what B sees then is
the machine's floor (the burst's client and the emulator on the CPUs the gateway also runs on, and B's
upstream busy with A's streams), against which the gateway's own share of B's p99 is read.
``--rounds N``: N runs through the gateway and N direct, taking turns, each on a fresh gateway; the
medians of their p99s and B's ratio (bench/results/isolation-rounds.json).

A's client runs at the lowest CPU priority (``nice -n 19``) in both modes: it stands for callers on
other machines, and on a shared 2-CPU machine a client taking the CPUs as its 429s come back at once
(or its streams' first bytes) would be measured as the gateway's doing. ``--no-nice`` runs it as any
other process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import stop_all
from bench.stack import _cli, health_url, start_emulators, start_gateway, wait_ready
from bench.streams import raise_descriptor_limit

RESULTS = Path(__file__).with_name("results")
MODEL = "openai/gpt-4o-mini"


def _body(content: str, stream: bool, model: str = MODEL) -> bytes:
    return json.dumps(
        {
            "model": model,
            "stream": stream,
            "max_tokens": 60,
            "messages": [{"role": "user", "content": content}],
        }
    ).encode()


async def burst_client(url: str, key: str, n: int, model: str) -> dict[str, int]:
    """Group A: ``n`` slow streams at once (run in a process of its own)."""
    raise_descriptor_limit(n)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = _body("burst [slow:2000] [delay:50] [tokens:40]", True, model)
    outcome: dict[str, int] = {}

    async def one(session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                kind = str(response.status)
        except aiohttp.ClientError as exc:
            kind = type(exc).__name__
        outcome[kind] = outcome.get(kind, 0) + 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=300)
    ) as session:
        await asyncio.gather(*(one(session) for _ in range(n)))
    return outcome


async def measure(
    url: str, health: str, key: str, calls: int, every: float = 0.025
) -> dict[str, list[float]]:
    """Group B's ``calls`` calls, one after another, one every ``every`` seconds (or as soon as the last one
    ended), and ``/healthz`` every 20 ms meanwhile: their latencies (seconds)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = _body("hello [tokens:12]", False)
    b: list[float] = []
    probes: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:

        async def probe() -> None:
            while not done.is_set():
                began = time.perf_counter()
                async with session.get(health) as response:
                    await response.read()
                probes.append(time.perf_counter() - began)
                await asyncio.sleep(0.02)

        prober = asyncio.ensure_future(probe())
        t0 = time.perf_counter()
        for _ in range(calls):
            began = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status
            b.append(time.perf_counter() - began)
            if b[-1] > 0.05:
                print(f"    slow B call at +{began - t0:.2f} s: {b[-1] * 1000:.0f} ms", file=sys.stderr)
            await asyncio.sleep(max(0.0, every - b[-1]))
        done.set()
        await prober
    return {"b": b, "healthz": probes}


def _figures(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "max_ms": round(ms[-1], 2),
        "n": len(ms),
    }


def run(
    burst_size: int, calls: int, store: tuple[str, ...], direct: bool, nice: bool = True
) -> dict[str, Any]:
    """One run: a gateway and its emulators started afresh, B quiet, then B under A's burst (to the
    gateway, or with ``direct`` to the emulator itself)."""
    procs = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        logs = tmp / "logs"
        logs.mkdir()
        try:
            emulators_proc, emulators = start_emulators(logs)
            procs.append(emulators_proc)
            target = start_gateway(logs, tmp, emulators, limits=False, store=store)  # no limits set
            procs.append(target.proc)
            wait_ready(target, 60)
            config = tmp / "gateway" / "router.toml"
            _cli(
                ["--config", str(config), "groups", "create", "other", "--credits", "1000000"],
                logs / "cli.log",
            )
            b_key = _cli(["--config", str(config), "keys", "create", "--group", "other"], logs / "cli.log")
            b_key = b_key.strip().splitlines()[-1].strip()
            health = health_url(target)
            asyncio.run(measure(target.url, health, b_key, 20, 0.0))  # warm-up
            quiet = asyncio.run(measure(target.url, health, b_key, calls))
            a_url, a_key, a_model = target.url, target.key, MODEL
            if direct:  # the emulator's own address and key, its own name of the model
                base, a_key = emulators["openai"]
                a_url, a_model = f"{base}/chat/completions", MODEL.split("/", 1)[1]
            niced = ["nice", "-n", "19"] if nice else []
            burst = subprocess.Popen(
                [
                    *niced,
                    sys.executable,
                    "-m",
                    "bench.isolation",
                    "--burst-client",
                    a_url,
                    a_key,
                    str(burst_size),
                    a_model,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(0.2)  # A's streams are opening (their first bytes come after 2 s, the last 2 s later)
            loaded = asyncio.run(measure(target.url, health, b_key, calls))
            out, _ = burst.communicate(timeout=600)
            a = json.loads(out.strip().splitlines()[-1])
        finally:
            stop_all(procs)
    return {
        "burst": burst_size,
        "through": "emulator" if direct else "gateway",
        "a_outcomes": a,
        "a_niced": nice,
        "b_quiet": _figures(quiet["b"]),
        "b_under_burst": _figures(loaded["b"]),
        "healthz_quiet": _figures(quiet["healthz"]),
        "healthz_under_burst": _figures(loaded["healthz"]),
    }


def _print(results: dict[str, Any]) -> None:
    print(f"  through the {results['through']}:")
    for name in ("b_quiet", "b_under_burst", "healthz_quiet", "healthz_under_burst"):
        f = results[name]
        print(
            f"    {name:20s} p50 {f['p50_ms']:8.2f} ms  p99 {f['p99_ms']:8.2f} ms  max {f['max_ms']:8.2f} ms  ({f['n']})"
        )
    print(f"    group A's {results['burst']} streams: {results['a_outcomes']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--store", action="append", default=[], help="a line for the [store] section")
    parser.add_argument(
        "--direct", action="store_true", help="the burst to the emulator itself (the machine's floor)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="this many rounds each through the gateway and direct, taking turns; the medians and ratios",
    )
    parser.add_argument(
        "--no-nice", action="store_true", help="A's client at the same CPU priority as the rest"
    )
    parser.add_argument(
        "--burst-client", nargs=4, metavar=("URL", "KEY", "N", "MODEL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.burst_client:
        url, key, n, model = args.burst_client
        print(json.dumps(asyncio.run(burst_client(url, key, int(n), model))))
        return 0
    RESULTS.mkdir(exist_ok=True)
    if not args.rounds:
        results = run(args.burst, args.calls, tuple(args.store), args.direct, not args.no_nice)
        _print(results)
        (RESULTS / ("isolation-direct.json" if args.direct else "isolation.json")).write_text(
            json.dumps(results, indent=1) + "\n"
        )
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"gateway": [], "emulator": []}
    for _ in range(args.rounds):
        for direct in (False, True):
            results = run(args.burst, args.calls, tuple(args.store), direct, not args.no_nice)
            _print(results)
            runs[results["through"]].append(results)

    def median(through: str, name: str) -> float:
        return statistics.median(r[name]["p99_ms"] for r in runs[through])

    summary = {
        name: {"gateway_p99_ms": median("gateway", name), "direct_p99_ms": median("emulator", name)}
        for name in ("b_under_burst", "healthz_under_burst")
    }
    ratio = summary["b_under_burst"]["gateway_p99_ms"] / summary["b_under_burst"]["direct_p99_ms"]
    print(
        f"  medians of {args.rounds} rounds: B's p99 under the burst {summary['b_under_burst']['gateway_p99_ms']:.1f} ms "
        f"through the gateway, {summary['b_under_burst']['direct_p99_ms']:.1f} ms direct ({ratio:.2f}x); "
        f"/healthz p99 {summary['healthz_under_burst']['gateway_p99_ms']:.1f} ms"
    )
    (RESULTS / "isolation-rounds.json").write_text(
        json.dumps({"rounds": runs, "medians": summary, "ratio": ratio}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
