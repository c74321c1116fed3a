"""Where one call's time goes inside each server, one client: the added latency of ``make bench``, taken apart.

    .venv/bin/python -m bench.timeline [--calls 2000] [--rounds 3] [--servers bare,bare-tuned,gateway]

Each server runs under ``bench/probe.py`` (as callgrind wraps it for ``bench.instructions``), which
times every request's milestones from the moment hypercorn hands it to the ASGI app: the upstream
request (sent, and the upstream's headers in), the response's start and its last body message, and,
in the gateway, the entry and exit of the steps in ``STEPS``. One client (aiohttp, one connection)
makes ``--calls`` calls to each server in turn, ``--rounds`` times, after a warm-up; the median of
each milestone over the last round is printed (and its 99th percentile), with the client's p50 and
p99 for every round. The servers: the bare proxy (stock hypercorn: the floor the latency budget is
against), the same proxy on the gateway's server layer, the gateway with every feature on (as
``make bench`` runs them).

What to read: the segments before the upstream request, from the upstream's headers to the
response's start, and the response's send, of the gateway against the bare proxy. A probe costs about
a microsecond, so the gateway's later milestones run a little late (its steps are probed, the bare
proxy's are not). Results: bench/results/timeline.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.load import body_bytes, headers_for, new_session, one_request, percentile
from bench.procs import stop_all
from bench.stack import ROOT, Target, git_revision, start_bare, start_emulators, start_gateway, wait_ready

RESULTS = Path(__file__).with_name("results")
PROBE = [sys.executable, str(ROOT / "bench" / "probe.py")]
# the gateway's steps on a chat call's path, in order (module:Class:function)
STEPS = ",".join(
    (
        "router.middleware:Front:__call__",
        "gateway.auth:Authenticator:authenticate",
        "router.chat::read_json_body",
        "router.chat::parse_chat_request",
        "gateway.pipeline:Pipeline:check",
        "gateway.chat_codec:ChatCodec:leg",
        "gateway.ratelimit:RateLimiter:admit",
        "billing.ledger:LocalLedger:reserve",
        "gateway.pipeline::open_upstream",
        "gateway.pipeline:Pipeline:complete",
        "gateway.chat_codec:ChatLeg:answer",
        "billing.ledger:Meter:finish",
        "billing.owed:OwedLog:write",
    )
)
SEGMENTS = (  # (name, from, to): what the report sums up
    ("before the upstream request", "app called", "upstream request >"),
    ("the upstream request", "upstream request >", "upstream request <"),
    ("upstream's headers → response start", "upstream request <", "response start"),
    ("response start → last body sent", "response start", "response last body <"),
)


SERVERS = {
    "bare": "hypercorn",
    "bare-tuned": "hypercorn-tuned",
    "gateway": None,
}  # name -> the bare proxy's server


def start_server(name: str, tmp: Path, emulators: dict[str, tuple[str, str]]) -> Target:
    logs = RESULTS  # (bench/results/<server>.log, as make bench's)
    server = SERVERS[name]
    if server is None:
        os.environ["BENCH_PROBE_STEPS"] = STEPS
        try:
            return start_gateway(logs, tmp, emulators, wrap=PROBE)
        finally:
            del os.environ["BENCH_PROBE_STEPS"]
    return start_bare(logs, *emulators["openai"], server, wrap=PROBE)


async def calls(target: Target, n: int) -> list[float]:
    data, headers = body_bytes(target.model, False, 12), headers_for(target)
    took = []
    async with new_session(0) as session:
        for _ in range(n):
            seconds, _, error = await one_request(session, target.url, data, headers, False)
            if error is not None:
                raise RuntimeError(f"{target.name}: {error}")
            took.append(seconds * 1e6)
    return took


def probed(target: Target, n: int, out: Path) -> tuple[list[float], dict[str, Any]]:
    """``n`` calls to ``target``, and its probes' medians over them."""
    pid = target.proc.popen.pid
    asyncio.run(calls(target, max(n // 10, 50)))  # warm-up
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.1)
    took = asyncio.run(calls(target, n))
    written = out / f"probe-{pid}.json"
    written.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while not written.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not written.exists():
        raise RuntimeError(f"{target.name}: its probes wrote nothing (see its log: {target.proc.log})")
    return took, json.loads(written.read_text())


def report(results: dict[str, Any]) -> str:
    lines = []
    for name, result in results["servers"].items():
        rounds = ", ".join(f"{r['p50_us']:,.0f} / {r['p99_us']:,.0f}" for r in result["rounds"])
        lines.append(f"{name}: the client's p50 / p99 per round (µs): {rounds}")
        milestones = result["milestones"]
        lines.append("     median  p99 (µs from the app's call)")
        for label, mark in sorted(milestones.items(), key=lambda kv: kv[1]["us"]):
            lines.append(f"  {mark['us']:9.1f} {mark['p99_us']:9.1f}  {label}")
        for segment, begin, end in SEGMENTS:
            if begin in milestones and end in milestones:
                lines.append(
                    f"  segment {segment}: {milestones[end]['us'] - milestones[begin]['us']:.1f} µs (medians)"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=2000, help="calls per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="bare,bare-tuned,gateway")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        parser.error(f"unknown servers: {', '.join(unknown)} (known: {', '.join(SERVERS)})")
    results: dict[str, Any] = {
        "commit": git_revision(),
        "calls": args.calls,
        "rounds": args.rounds,
        "servers": {},
    }
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["BENCH_PROBE_DIR"] = str(tmp)
        emulator, emulators = start_emulators(RESULTS)
        procs = [emulator]
        try:
            targets = {}
            for name in names:
                targets[name] = target = start_server(name, tmp, emulators)
                procs.append(target.proc)
                wait_ready(target, 60)
            for _ in range(args.rounds):  # (the servers in turn, so each round sees the same machine)
                for name, target in targets.items():
                    took, probes = probed(target, args.calls, tmp)
                    took.sort()
                    entry = results["servers"].setdefault(name, {"rounds": []})
                    entry["rounds"].append({"p50_us": percentile(took, 50), "p99_us": percentile(took, 99)})
                    entry["milestones"] = probes["milestones"]  # (the last round's)
        finally:
            stop_all(procs)
    print(report(results), flush=True)
    (RESULTS / "timeline.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
