"""The benchmark run: start everything, measure side by side, stop everything, report.

Order of a run: side venv (LiteLLM + matplotlib) → emulators → gateway, bare proxy, LiteLLM (started
together) → smoke calls → 1-client latency, all targets interleaved → throughput at each concurrency,
non-stream then stream, the targets one after the other for each setting → peak RSS → stop → report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench import benchvenv, portkey, report
from bench.procs import Proc, StartError, cpu_seconds, peak_rss_kb, stop_all
from bench.stack import (
    REDIS_URL,
    ROOT,
    UPSTREAM_MODEL,
    Target,
    drop_pg_database,
    git_revision,
    pg_database,
    smoke,
    start_bare,
    start_emulators,
    start_gateway,
    start_litellm,
    wait_ready,
)

RESULTS = ROOT / "bench" / "results"
T0 = time.monotonic()


def say(text: str) -> None:
    """A progress line, stamped with the seconds since the run began."""
    print(f"[{time.monotonic() - T0:6.1f}s] {text}", flush=True)


@dataclass
class Plan:
    latency_seconds: float
    round_seconds: float
    duration: float
    rounds: int
    warmup: float
    warmup_max: float
    grace: float
    settle_max: float
    clients: list[int]
    tokens: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench", description="Gateway vs bare proxy vs LiteLLM, side by side."
    )
    p.add_argument(
        "--quick", action="store_true", help="short run (about a minute): same figures, fewer samples"
    )
    p.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out (no side venv install)")
    p.add_argument("--litellm-version", default=benchvenv.LITELLM_VERSION)
    p.add_argument("--no-portkey", action="store_true", help="leave Portkey's gateway out (no npm install)")
    p.add_argument("--clients", default="32,256", help="concurrency levels for throughput, comma-separated")
    p.add_argument("--duration", type=float, help="seconds measured per throughput run (default 3, quick 1)")
    p.add_argument(
        "--rounds", type=int, help="throughput runs per target and setting, interleaved (default 3, quick 1)"
    )
    p.add_argument(
        "--latency-seconds", type=float, help="seconds of the 1-client phase (default 40, quick 5)"
    )
    p.add_argument("--tokens", type=int, default=12, help="answer length asked of the emulator (default 12)")
    p.add_argument(
        "--no-extras",
        action="store_true",
        help="skip the ledger, concurrent-streams and instruction-count runs",
    )
    p.add_argument(
        "--no-alt",
        action="store_true",
        help="skip the other ways to run the gateway (uvicorn, 2 workers on PostgreSQL) and bare uvicorn",
    )
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        latency_seconds=args.latency_seconds or (5.0 if quick else 40.0),
        round_seconds=0.2,
        duration=args.duration or (1.0 if quick else 3.0),
        rounds=max(args.rounds or (1 if quick else 3), 1),
        warmup=0.3 if quick else 2.0,
        warmup_max=2.0 if quick else 15.0,
        grace=0.5 if quick else 2.0,
        settle_max=2.0 if quick else 5.0,
        clients=[int(c) for c in args.clients.split(",") if c.strip()],
        tokens=args.tokens,
    )


def load(mode: str, specs: list[str], extra: list[str], timeout: float) -> dict[str, Any]:
    """Run the load generator in its own process; its JSON result, or {"failed": why}."""
    argv = [sys.executable, "-m", "bench.load", mode, *[a for s in specs for a in ("--target", s)], *extra]
    with open(RESULTS / "load.log", "a") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        try:
            done = subprocess.run(
                argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {"failed": f"load generator timed out after {timeout:.0f}s"}
    if done.returncode != 0:
        return {"failed": f"load generator exited with {done.returncode} (see bench/results/load.log)"}
    return dict(json.loads(done.stdout))


def measure_latency(targets: list[Target], plan: Plan) -> dict[str, Any]:
    warmup = min(2.0, plan.latency_seconds / 4)
    extra = [
        "-d",
        str(plan.latency_seconds),
        "--round",
        str(plan.round_seconds),
        "-w",
        str(warmup),
        "--tokens",
        str(plan.tokens),
    ]
    say(
        f"  1 client, {len(targets)} targets x (non-stream, stream), interleaved for {plan.latency_seconds:.0f}s"
    )
    result = load("latency", [t.spec() for t in targets], extra, plan.latency_seconds * 2 + 60)
    if "failed" in result:
        return result
    direct = result["targets"].get("direct", {})
    for name, modes in result["targets"].items():
        for mode, entry in modes.items():
            base = direct.get(mode, {})
            if name == "direct" or "latency_ms" not in entry or "latency_ms" not in base:
                continue
            entry["added_ms"] = {
                p: round(entry["latency_ms"][p] - base["latency_ms"][p], 3) for p in ("p50", "p99")
            }
            paired = [a - b for a, b in zip(entry["round_p50_ms"], base["round_p50_ms"], strict=False)]
            if paired:
                entry["added_p50_ms_median_of_rounds"] = round(sorted(paired)[len(paired) // 2], 3)
            if "ttft_ms" in entry and "ttft_ms" in base:
                entry["ttft_added_ms"] = {
                    p: round(entry["ttft_ms"][p] - base["ttft_ms"][p], 3) for p in ("p50", "p99")
                }
    return result


def settle(procs: list[Proc], idle_share: float = 0.15, limit: float = 5.0) -> None:
    """Wait (at most ``limit`` s) until the servers are idle, so one run's backlog does not slow the next."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(0.25)
        if sum(cpu_seconds(p.pid) for p in procs) - before < idle_share * 0.25:
            return


def measure_throughput(
    targets: list[Target], emulator: Proc, plan: Plan, dead: dict[str, str]
) -> list[dict[str, Any]]:
    """Each setting (mode, clients): ``plan.rounds`` rounds, every target once per round, the order
    rotating; a target's figure is its median round (by req/s), with every round's req/s kept in
    ``rounds_rps`` (report.py pairs them by round for the ratios)."""
    procs = list({t.proc.pid: t.proc for t in targets}.values())
    runs: list[dict[str, Any]] = []
    for stream in (False, True):
        for clients in plan.clients:
            rounds: dict[str, list[dict[str, Any]]] = {}
            for n in range(plan.rounds):
                shift = n % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    if target.name in dead or stream not in target.modes:
                        continue
                    if not target.proc.alive():
                        dead[target.name] = (
                            f"process exited with code {target.proc.popen.returncode} during the run"
                        )
                        continue
                    result = throughput_run(target, emulator, plan, stream, clients)
                    settle(procs, limit=plan.settle_max)
                    rounds.setdefault(target.name, []).append(result)
                    say(
                        f"  {'stream' if stream else 'non-stream':<10} {clients:>4} clients  {target.label:<15} "
                        f"{report.fmt_rps(result)}"
                        + (f"  (round {n + 1}/{plan.rounds})" if plan.rounds > 1 else "")
                    )
            for target in targets:
                if target.name in rounds:
                    runs.append(median_round(rounds[target.name]))
    return runs


def throughput_run(target: Target, emulator: Proc, plan: Plan, stream: bool, clients: int) -> dict[str, Any]:
    extra = [
        "-c",
        str(clients),
        "-d",
        str(plan.duration),
        "-w",
        str(plan.warmup),
        "--warmup-max",
        str(plan.warmup_max),
        "--grace",
        str(plan.grace),
        "--tokens",
        str(plan.tokens),
    ]
    if stream:
        extra.append("--stream")
    extra += ["--watch", f"server={target.proc.pid}", "--watch", f"emulator={emulator.pid}"]
    result = load("throughput", [target.spec()], extra, plan.warmup_max + plan.duration + 60)
    result.update(target=target.name, stream=stream, clients=clients)
    per_request = result.get("cpu_us_per_req") or {}
    result["server_cpu_us_per_req"] = per_request.get("server")
    result["emulator_cpu_us_per_req"] = per_request.get("emulator")
    return result


def median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median req/s (a failed round counts as 0), with every round's req/s."""
    rps = [r.get("rps", 0.0) if "failed" not in r else 0.0 for r in results]
    order = sorted(range(len(results)), key=lambda i: rps[i])
    chosen = dict(results[order[(len(order) - 1) // 2]])
    chosen["rounds_rps"] = rps
    return chosen


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_mb": mem_kb // 1024,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def versions(bench_venv: benchvenv.BenchVenv | None) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("model-router", "aiohttp", "starlette", "hypercorn", "msgspec", "uvloop"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["litellm"] = bench_venv.litellm_version if bench_venv else None
    out["git"] = git_revision()
    return out


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for old in RESULTS.glob("*.log"):
        old.unlink()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(
        signal.SIGINT, _raise_interrupt
    )  # also when started with SIGINT ignored (e.g. in the background)
    began = time.time()
    results: dict[str, Any] = {
        "command": shlex.join(
            [os.path.relpath(sys.executable, ROOT), "-m", "bench", *(sys.argv[1:] if argv is None else argv)]
        ),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began)),
        "plan": plan.__dict__,
        "machine": machine_info(),
        "unavailable": {},
    }
    unavailable: dict[str, str] = results["unavailable"]
    say(
        f"bench: {'quick' if args.quick else 'default'} run; logs and results in {RESULTS.relative_to(ROOT)}/"
    )

    bench_venv = benchvenv.ensure(
        ROOT, args.litellm_version, RESULTS / "bench-venv-install.log", not args.no_litellm
    )
    if bench_venv.litellm_problem:
        unavailable["litellm"] = bench_venv.litellm_problem
        say(f"  LiteLLM left out: {bench_venv.litellm_problem}")
    portkey_version, why = (
        (None, "skipped (--no-portkey)")
        if args.no_portkey
        else portkey.ensure(RESULTS / "portkey-install.log")
    )
    if why:
        unavailable["portkey"] = why
        say(f"  Portkey left out: {why}")
    results["versions"] = versions(bench_venv)
    results["versions"]["portkey"] = portkey_version

    procs: list[Proc] = []
    targets: list[Target] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    pg_name = f"router_bench_{os.getpid()}"
    interrupted = False
    try:
        peers = [
            name for name, on in (("LiteLLM", bench_venv.litellm_version), ("Portkey", portkey_version)) if on
        ]
        say("starting the emulators, then the gateway, the bare proxy" + "".join(f", {p}" for p in peers))
        emulator, emulators = start_emulators(RESULTS)
        procs.append(emulator)
        base_url, upstream_key = emulators["openai"]
        direct = Target(
            "direct",
            "emulator direct",
            emulator,
            f"{base_url}/chat/completions",
            upstream_key,
            UPSTREAM_MODEL,
        )
        starting: list[Target] = []
        try:  # LiteLLM first: it takes the longest to boot
            if bench_venv.litellm_version:
                starting.append(start_litellm(RESULTS, tmp, bench_venv.litellm, base_url, upstream_key))
            if portkey_version:
                starting.append(portkey.start_portkey(RESULTS, base_url, upstream_key))
            starting.append(start_gateway(RESULTS, tmp, emulators))
            starting.append(start_bare(RESULTS, base_url, upstream_key))
            if not args.no_alt:
                starting.append(start_gateway(RESULTS, tmp, emulators, "gw-uvicorn"))
                starting.append(start_bare(RESULTS, base_url, upstream_key, "uvicorn"))
                try:
                    url = pg_database(pg_name)
                except StartError as exc:
                    unavailable["gw-2workers"] = str(exc)
                    say(f"  gateway with 2 workers left out: {exc}")
                else:
                    starting.append(start_gateway(RESULTS, tmp, emulators, "gw-2workers", url, REDIS_URL))
        finally:
            procs += [t.proc for t in starting]
        targets.append(direct)
        starting.sort(key=lambda t: report.NAMES.index(t.name))
        broken = smoke(direct)
        if broken:
            raise StartError(f"the emulator itself does not answer: {broken}")
        for target in starting:
            try:
                wait_ready(target, 180 if target.name == "litellm" else 30)
            except StartError as exc:
                unavailable[target.name] = str(exc)
                say(f"  {target.label} left out: {exc}")
                continue
            failures = smoke(target)
            for stream, why in failures.items():
                unavailable[f"{target.name} ({'stream' if stream else 'non-stream'})"] = why
                say(f"  {target.label} {'stream' if stream else 'non-stream'} left out: {why}")
            target.modes = [m for m in target.modes if m not in failures]
            if target.modes:
                targets.append(target)
        say("all up\n" + report.legend(procs))

        say("measuring added latency (1 client)")
        results["latency_1_client"] = measure_latency(targets, plan)
        say("measuring throughput (closed loop)")
        results["throughput"] = measure_throughput(targets, emulator, plan, unavailable)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted")
    except StartError as exc:
        results["error"] = str(exc)
        say(f"bench: could not set up: {exc}")
    finally:
        for proc in procs:
            if proc.alive():
                proc.peak_rss_kb = peak_rss_kb(proc.pid)
        say("stopping the servers")
        stop_all(procs, timeout=4.0)
        shutil.rmtree(tmp, ignore_errors=True)
        if not args.no_alt:
            drop_pg_database(pg_name)

    results["processes"] = [
        {
            "name": p.name,
            "role": p.role,
            "pid": p.pid,
            "argv": p.argv,
            "peak_rss_kb": p.peak_rss_kb,
            "stop_seconds": p.stop_seconds,
            "log": str(p.log.relative_to(ROOT)),
            "notes": p.notes,
        }
        for p in procs
    ]
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["elapsed_s"] = round(time.time() - began, 1)
    if interrupted:
        results["interrupted"] = True
    report.derive(results)
    (RESULTS / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report.render(results), flush=True)
    print(report.plot(results, bench_venv, RESULTS / "bench.json", RESULTS / "bench.png"), flush=True)
    if not interrupted and not args.no_extras:
        extras(args)
    return 130 if interrupted else (1 if "error" in results else 0)


def extras(args: argparse.Namespace) -> None:
    """The ledger's settlement rate per store, N concurrent slow streams through one process, three
    rate-limited deployments against one, the latency added to a 100-input embeddings call, and the instructions per call of the gateway and the bare
    proxy (noise-free, unlike req/s)."""
    from bench import deployments, embeddings, instructions, ledger, streams

    say("ledger settlement benchmark (SQLite and PostgreSQL)")
    try:
        print(ledger.report(ledger.run(2.0 if args.quick else 5.0)), flush=True)
    except Exception as exc:  # noqa: BLE001 - reported, the rest of the run stands
        print(f"ledger benchmark failed: {exc}", flush=True)
    # HTTP/1.1 holds two descriptors a stream in the gateway, HTTP/2 one: 10,000 streams fit a 20,000 limit
    runs = [(1000, [])] if args.quick else [(5000, []), (10_000, ["--http2", "100"])]
    for n, protocol in runs:
        say(f"{n} concurrent streams through one gateway process, {'HTTP/2' if protocol else 'HTTP/1.1'}")
        try:
            streams.main(
                ["--streams", str(n), "--tokens", "30" if args.quick else "90", *protocol], exit_after=False
            )
        except Exception as exc:  # noqa: BLE001
            print(f"streams benchmark failed: {exc}", flush=True)
    say("3 deployments limited to R RPM each against 1, offered 2.5 R")
    try:
        print(deployments.report(deployments.run(15.0 if args.quick else 30.0)), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"deployments benchmark failed: {exc}", flush=True)
    say("added latency of a 100-input embeddings call (gateway vs the emulator directly)")
    try:
        print(embeddings.report(embeddings.run(10.0 if args.quick else 20.0)), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"embeddings benchmark failed: {exc}", flush=True)
    say("instructions per call under callgrind: gateway and bare proxy")
    try:
        instructions.main(
            ["--calls", "100", "--servers", "bare,gateway"] if args.quick else ["--calls", "300"]
        )
    except Exception as exc:  # noqa: BLE001
        print(f"instructions benchmark failed: {exc}", flush=True)
