"""The load generator: its own process, one aiohttp ClientSession with keep-alive, uvloop when present.

Two modes, each printing one JSON object on stdout:

    python -m bench.load throughput --target NAME,URL,KEY,MODEL [--stream] -c 32 -d 8 -w 2
        a closed loop of C clients; each sends its next request as soon as the last one ends.
        Warm-up lasts at least -w seconds and until C requests have completed (so every client has
        been through one full request), capped at --warmup-max; then the window of -d seconds is
        measured: requests that complete inside it count, those still open at its end are not counted
        (they get --grace seconds to end cleanly, then are cut).

    python -m bench.load latency --target ... --target ...[,nonstream|,stream] -d 30 --round 0.25
        one client, the targets (x non-stream and stream, unless the target names one mode)
        interleaved in short rounds whose order rotates, so that machine noise lands on all alike.

Per request the hot path does only: post pre-encoded bytes, read the body (stream: chunks until
``data: [DONE]``, noting when the first non-empty ``content`` arrives), and append a float.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.procs import cpu_seconds

PROMPT = "Write a short greeting. [tokens:{tokens}]"
_CONTENT = re.compile(rb'"content":\s?"[^"]')
_DONE = b"data: [DONE]"


@dataclass
class Target:
    name: str
    url: str
    key: str
    model: str
    modes: tuple[bool, ...] = (False, True)  # latency mode: non-stream and/or stream
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Target:
        """NAME,URL,KEY,MODEL[,nonstream|stream][,header=NAME:VALUE]..."""
        name, url, key, model, *rest = text.split(",")
        only = [r for r in rest if r in ("stream", "nonstream")]
        headers = dict(r.removeprefix("header=").split(":", 1) for r in rest if r.startswith("header="))
        modes = (only[0] == "stream",) if only else (False, True)
        return cls(name, url, key, model, modes, headers)


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)  # seconds
    ttfts: list[float] = field(default_factory=list)  # seconds, streams only
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def body_bytes(model: str, stream: bool, tokens: int) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT.format(tokens=tokens)}],
        "stream": stream,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def headers_for(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.key}", "Content-Type": "application/json", **target.headers}


async def one_request(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str], stream: bool
) -> tuple[float, float | None, str | None]:
    """(latency, ttft or None, error kind or None) of one call."""
    start = time.perf_counter()
    try:
        async with session.post(url, data=data, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return time.perf_counter() - start, None, f"http_{response.status}"
            if not stream:
                await response.read()
                return time.perf_counter() - start, None, None
            ttft: float | None = None
            tail = b""
            done = False
            async for chunk in response.content.iter_any():
                if ttft is None and _CONTENT.search(chunk):
                    ttft = time.perf_counter() - start
                if _DONE in tail + chunk[:16] or _DONE in chunk:
                    done = True
                tail = chunk[-16:]
            if not done:
                return time.perf_counter() - start, ttft, "stream_without_done"
            return time.perf_counter() - start, ttft, None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return time.perf_counter() - start, None, type(exc).__name__


def summary(samples: Samples, seconds: float | None = None) -> dict[str, Any]:
    lat = sorted(samples.latencies)
    out: dict[str, Any] = {"requests": len(lat), "errors": samples.errors, "error_kinds": samples.error_kinds}
    if seconds:
        out["seconds"] = round(seconds, 3)
        out["rps"] = round(len(lat) / seconds, 1)
    for name, values in (("latency", lat), ("ttft", sorted(samples.ttfts))):
        if values:
            out[f"{name}_ms"] = {
                "p50": round(percentile(values, 50) * 1000, 3),
                "p90": round(percentile(values, 90) * 1000, 3),
                "p99": round(percentile(values, 99) * 1000, 3),
                "mean": round(sum(values) / len(values) * 1000, 3),
            }
    return out


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


def new_session(limit: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=120)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",))


async def throughput(
    target: Target,
    stream: bool,
    clients: int,
    duration: float,
    warmup: float,
    warmup_max: float,
    grace: float,
    tokens: int,
    watch: dict[str, tuple[int, tuple[str, ...]]],
) -> dict[str, Any]:
    data = body_bytes(target.model, stream, tokens)
    headers = headers_for(target)
    measured = Samples()
    completed = 0  # every completion, warm-up included (for CPU per request)
    served: set[int] = set()  # the clients whose first call has ended (each opened its connection then)
    window: list[float] = []  # [start, end] once the window opens
    stop_at = time.perf_counter() + warmup_max + duration  # moved earlier once the window opens
    stagger = min(warmup / 2, 1.0) / clients

    async def client(index: int) -> None:
        nonlocal completed
        await asyncio.sleep(index * stagger)
        while time.perf_counter() < stop_at:
            latency, ttft, error = await one_request(session, target.url, data, headers, stream)
            now = time.perf_counter()
            completed += 1
            if not window:
                served.add(index)
                continue
            if now > window[1]:
                return
            if error is not None:
                measured.error(error)
            else:
                measured.latencies.append(latency)
                if ttft is not None:
                    measured.ttfts.append(ttft)

    async with new_session(clients) as session:
        began = time.perf_counter()
        tasks = [asyncio.ensure_future(client(i)) for i in range(clients)]
        while True:  # warm-up: long enough, and every client served once (bounded by warmup_max)
            await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - began
            if elapsed >= warmup_max or (elapsed >= warmup and len(served) == clients):
                break
        cpu0 = time.process_time()
        watched0 = {name: cpu_seconds(*spec) for name, spec in watch.items()}
        window.extend([time.perf_counter(), time.perf_counter() + duration])
        stop_at = window[1]
        await asyncio.sleep(duration)
        cpu = time.process_time() - cpu0
        watched = {name: cpu_seconds(*spec) - watched0[name] for name, spec in watch.items()}
        # no new requests start now; give the open ones a moment to end cleanly, then cut them
        await asyncio.wait(tasks, timeout=grace)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out = summary(measured, duration)
    out.update(
        target=target.name,
        stream=stream,
        clients=clients,
        warmup_s=round(window[0] - began, 2),
        completed_total=completed,
        loadgen_cpu_share=round(cpu / duration, 2),
    )
    done = len(measured.latencies) + measured.errors
    out["cpu_s_in_window"] = {name: round(seconds, 3) for name, seconds in watched.items()}
    out["cpu_us_per_req"] = (
        {name: round(seconds / done * 1e6, 1) for name, seconds in watched.items()} if done else {}
    )
    return out


async def latency(
    targets: list[Target], duration: float, round_seconds: float, warmup: float, tokens: int
) -> dict[str, Any]:
    cells = [(t, stream) for t in targets for stream in t.modes]
    payloads = {(t.name, s): (t.url, body_bytes(t.model, s, tokens), headers_for(t)) for t, s in cells}
    results = {(t.name, s): Samples() for t, s in cells}
    round_medians: dict[tuple[str, bool], list[float]] = {(t.name, s): [] for t, s in cells}

    async def run_cell(name: str, stream: bool, seconds: float, record: bool) -> None:
        url, data, headers = payloads[(name, stream)]
        samples = results[(name, stream)]
        lat: list[float] = []
        end = time.perf_counter() + seconds
        while True:
            took, ttft, error = await one_request(session, url, data, headers, stream)
            if record:
                if error is not None:
                    samples.error(error)
                else:
                    lat.append(took)
                    if ttft is not None:
                        samples.ttfts.append(ttft)
            if time.perf_counter() >= end:
                break
        if record and lat:
            samples.latencies.extend(lat)
            lat.sort()
            round_medians[(name, stream)].append(percentile(lat, 50))

    async with new_session(0) as session:  # no cap: one idle keep-alive connection per target
        for t, stream in cells:  # warm-up: connections open, code paths hot
            await run_cell(t.name, stream, warmup / len(cells), record=False)
        rounds = 0
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            shift = rounds % len(cells)
            for t, stream in cells[shift:] + cells[:shift]:
                await run_cell(t.name, stream, round_seconds, record=True)
            rounds += 1
    out: dict[str, Any] = {"rounds": rounds, "round_seconds": round_seconds, "targets": {}}
    for (name, stream), samples in results.items():
        entry = summary(samples)
        entry["round_p50_ms"] = [round(v * 1000, 3) for v in round_medians[(name, stream)]]
        out["targets"].setdefault(name, {})["stream" if stream else "nonstream"] = entry
    return out


def parse_watch(text: str) -> tuple[str, tuple[int, tuple[str, ...]]]:
    """NAME=PID[:TEXT|TEXT...] -> (NAME, (PID, TEXTs))."""
    name, _, rest = text.partition("=")
    pid, _, only = rest.partition(":")
    return name, (int(pid), tuple(t for t in only.split("|") if t))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", choices=["throughput", "latency"])
    p.add_argument("--target", action="append", required=True, type=Target.parse, help="NAME,URL,KEY,MODEL")
    p.add_argument("--stream", action="store_true", help="throughput mode: stream the answers")
    p.add_argument("-c", "--clients", type=int, default=32)
    p.add_argument("-d", "--duration", type=float, default=8.0, help="seconds measured")
    p.add_argument("-w", "--warmup", type=float, default=2.0, help="seconds of warm-up (at least)")
    p.add_argument("--warmup-max", type=float, default=15.0, help="throughput: longest warm-up")
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="NAME=PID[:TEXT|TEXT...]",
        help="throughput: a server process (and its descendants) whose CPU time to count over the "
        "window; with TEXTs, only the descendants whose command line holds one of them",
    )
    p.add_argument(
        "--grace", type=float, default=2.0, help="throughput: seconds open requests get at the end"
    )
    p.add_argument("--round", type=float, default=0.25, help="latency: seconds per target per round")
    p.add_argument("--tokens", type=int, default=12, help="answer length asked of the emulator")
    args = p.parse_args(argv)
    run: Any = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    if args.mode == "throughput":
        result = run(
            throughput(
                args.target[0],
                args.stream,
                args.clients,
                args.duration,
                args.warmup,
                max(args.warmup, args.warmup_max),
                args.grace,
                args.tokens,
                dict(parse_watch(w) for w in args.watch),
            )
        )
    else:
        result = run(latency(args.target, args.duration, args.round, args.warmup, args.tokens))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
