"""``python -m bench.embeddings``: the latency the gateway adds to a 100-input embeddings call.

The emulators (``router emulators``) and the gateway (``router serve``, every feature on, a SQLite
store) run as their own processes, as in ``make bench``. One client (aiohttp, keep-alive) calls
``POST /v1/embeddings`` with 100 inputs (``openai/text-embedding-3-small``, 1,536 dimensions) on the
emulator directly and through the gateway, in alternating rounds so the machine's noise lands on both;
*added* = the gateway's percentile minus the direct one. ``encoding_format`` base64 (the openai SDK's
default: the vectors pass through as strings) and float (1,536 x 100 numbers decoded and encoded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import stop_all
from bench.stack import ROOT, start_emulators, start_gateway, wait_ready

RESULTS = ROOT / "bench" / "results"
INPUTS = 100


def body(model: str, encoding: str) -> bytes:
    texts = [
        f"passage {i}: the router embeds every input of a retrieval workload exactly once"
        for i in range(INPUTS)
    ]
    return json.dumps({"model": model, "input": texts, "encoding_format": encoding}).encode()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def measure(
    targets: dict[str, tuple[str, str, str]], seconds: float, encoding: str
) -> dict[str, list[float]]:
    """Alternate 0.25 s rounds between the targets for ``seconds``; every call's latency in ms."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    payloads = {name: body(model, encoding) for name, (_, _, model) in targets.items()}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for name, (url, key, _) in targets.items():  # warm-up
            for _ in range(3):
                async with session.post(
                    url,
                    data=payloads[name],
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                ) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for name, (url, key, _) in targets.items():
                round_end = time.monotonic() + 0.25
                headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
                while time.monotonic() < round_end:
                    began = time.perf_counter()
                    async with session.post(url, data=payloads[name], headers=headers) as response:
                        await response.read()
                        if response.status != 200:
                            raise RuntimeError(f"{name}: HTTP {response.status}")
                    samples[name].append((time.perf_counter() - began) * 1000)
    return samples


def run(seconds: float = 20.0) -> dict[str, Any]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        emulator, emulators = start_emulators(RESULTS)
        procs.append(emulator)
        with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as tmp:
            gateway = start_gateway(RESULTS, Path(tmp), emulators, home="embeddings")
            procs.append(gateway.proc)
            wait_ready(gateway, 30)
            base_url, key = emulators["openai"]
            targets = {
                "direct": (f"{base_url}/embeddings", key, "text-embedding-3-small"),
                "gateway": (
                    gateway.url.replace("/chat/completions", "/embeddings"),
                    gateway.key,
                    "openai/text-embedding-3-small",
                ),
            }
            result: dict[str, Any] = {"inputs": INPUTS, "seconds": seconds}
            for encoding in ("base64", "float"):
                samples = asyncio.run(measure(targets, seconds / 2, encoding))
                figures = {
                    name: {
                        "calls": len(v),
                        "p50_ms": round(percentile(v, 50), 2),
                        "p99_ms": round(percentile(v, 99), 2),
                    }
                    for name, v in samples.items()
                }
                figures["added"] = {
                    p: round(figures["gateway"][p] - figures["direct"][p], 2) for p in ("p50_ms", "p99_ms")
                }
                result[encoding] = figures
            return result
    finally:
        stop_all(procs, timeout=4.0)


def report(result: dict[str, Any]) -> str:
    lines = [
        f"embeddings, {result['inputs']} inputs per call (openai/text-embedding-3-small, 1 client):",
        "  encoding   direct p50/p99 ms   gateway p50/p99 ms   added p50/p99 ms",
    ]
    for encoding in ("base64", "float"):
        f = result[encoding]
        lines.append(
            f"  {encoding:<9}  {f['direct']['p50_ms']:>7} / {f['direct']['p99_ms']:<7}   "
            f"{f['gateway']['p50_ms']:>7} / {f['gateway']['p99_ms']:<7}    "
            f"{f['added']['p50_ms']:>6} / {f['added']['p99_ms']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.embeddings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="measured, split between the two encodings"
    )
    args = parser.parse_args(argv)
    result = run(args.seconds)
    print(report(result), flush=True)
    (RESULTS / "embeddings.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
