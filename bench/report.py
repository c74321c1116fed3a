"""Turning the measured figures into ratios, budget checks, a table on stdout and a PNG chart."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.procs import Proc

NAMES = ["direct", "gateway", "bare", "gw-uvicorn", "bare-uvicorn", "gw-2workers", "litellm", "portkey"]
LABELS = {
    "direct": "emulator direct",
    "gateway": "gateway",
    "bare": "bare proxy",
    "litellm": "litellm",
    "portkey": "portkey",
    "gw-uvicorn": "gw uvicorn",
    "bare-uvicorn": "bare uvicorn",
    "gw-2workers": "gw 2 workers",
}
# other ways to run the gateway, each over the floor of its own server and over LiteLLM (not budget checks:
# the budget, docs/architecture.md, is about one process of `router serve`)
ALT_RATIOS = (
    ("gw-uvicorn", "bare-uvicorn"),
    ("gw-uvicorn", "litellm"),
    ("gw-2workers", "litellm"),
    ("gw-2workers", "bare"),
)
FEW_SAMPLES = 30
LOADGEN_BUSY = 0.9


def _order(name: str) -> int:
    order = ["emulators", *NAMES[1:]]
    return order.index(name) if name in order else len(order)


def fmt_rps(run: dict[str, Any]) -> str:
    if "failed" in run:
        return f"failed: {run['failed']}"
    lat = run.get("latency_ms", {})
    text = (
        f"{run.get('rps', 0):>8.1f} req/s  p50 {lat.get('p50', 0):>7.1f} ms  p99 {lat.get('p99', 0):>7.1f} ms"
    )
    if run.get("errors"):
        text += f"  errors {run['errors']} {run.get('error_kinds')}"
    return text


def legend(procs: list[Proc]) -> str:
    lines = [
        "processes (all on 127.0.0.1, sharing the machine's CPUs with each other and the load generator):"
    ]
    for p in sorted(procs, key=lambda p: _order(p.name)):
        lines.append(f"  {p.name:<10} pid {p.pid:<7} {p.role}")
    lines.append(
        "  load gen   one process per measurement: python -m bench.load (aiohttp + uvloop, one session);"
    )
    lines.append("             the harness itself only waits while it runs")
    return "\n".join(lines)


def _run(results: dict[str, Any], target: str, stream: bool, clients: int) -> dict[str, Any] | None:
    for run in results.get("throughput") or []:
        if (
            run["target"] == target
            and run["stream"] == stream
            and run["clients"] == clients
            and "failed" not in run
        ):
            return dict(run)
    return None


def _clients(results: dict[str, Any]) -> list[int]:
    return sorted({r["clients"] for r in results.get("throughput") or []})


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """req/s of ``a`` over ``b``: with rounds (bench/run.py ``measure_throughput``), the median of the
    rounds' ratios, each round's two runs measured minutes apart at most; else of the two figures."""
    ra, rb = a.get("rounds_rps") or [], b.get("rounds_rps") or []
    if len(ra) > 1 and len(ra) == len(rb):
        return round(statistics.median(x / y if y else 0.0 for x, y in zip(ra, rb, strict=True)), 2)
    return round(a["rps"] / b["rps"], 2)


def derive(results: dict[str, Any]) -> None:
    """Adds ``ratios``, ``budget`` (docs/architecture.md, Performance budget) and ``labels`` (the targets in order, for bench/plot.py)
    to the results."""
    results["labels"] = {n: LABELS[n] for n in NAMES}
    ratios = []
    for stream in (False, True):
        for clients in _clients(results):
            gw = _run(results, "gateway", stream, clients)
            row: dict[str, Any] = {"stream": stream, "clients": clients}
            for other in ("litellm", "portkey", "bare"):
                run = _run(results, other, stream, clients)
                if gw and run and run.get("rps"):
                    row[f"gateway_over_{other}"] = ratio(gw, run)
            for mine, other in ALT_RATIOS:
                a, b = _run(results, mine, stream, clients), _run(results, other, stream, clients)
                if a and b and b.get("rps"):
                    row[f"{mine}_over_{other}"] = ratio(a, b)
            ratios.append(row)
    results["ratios"] = ratios

    budget = []
    # added latency against the stack's floor (the bare hypercorn proxy), the same interleaved run: what
    # the gateway's features add to a hop, not what the machine's two shared CPUs add to any proxy
    targets = (results.get("latency_1_client") or {}).get("targets", {})
    gw_added = targets.get("gateway", {}).get("nonstream", {}).get("added_ms")
    bare_added = targets.get("bare", {}).get("nonstream", {}).get("added_ms")
    for p, limit in (("p50", 0.10), ("p99", 0.50)):
        value = round(gw_added[p] - bare_added[p], 3) if gw_added and bare_added else None
        budget.append(
            {
                "check": f"added latency {p} <= the bare proxy's + {limit:g} ms (1 client, non-stream)",
                "value": value,
                "unit": "ms",
                "pass": None if value is None else value <= limit,
            }
        )
    for row in ratios:
        mode = "stream" if row["stream"] else "non-stream"
        # against the bare proxy the budget is in instructions per call (bench.instructions), not req/s
        for key, limit, what in (
            ("gateway_over_litellm", 25.0, ">= 25x LiteLLM"),
            ("gateway_over_portkey", 3.0, ">= 3x Portkey"),
        ):
            value = row.get(key)
            budget.append(
                {
                    "check": f"throughput {what} ({mode}, {row['clients']} clients)",
                    "value": value,
                    "unit": "x",
                    "pass": None if value is None else value >= limit,
                }
            )
    results["budget"] = budget
    results["not_measured"] = [
        "instructions per call (<= 1.30x / 1.35x the bare proxy): python -m bench.instructions, after this table",
        "10,000 concurrent open streams, <= 40 KB each: python -m bench.streams, after this table",
    ]


def _cell(value: Any, width: int, digits: int = 1) -> str:
    if value is None:
        return f"{'-':>{width}}"
    if isinstance(value, str):
        return f"{value:>{width}}"
    return f"{value:>{width}.{digits}f}"


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    m = results.get("machine", {})
    v = results.get("versions", {})
    out.append("")
    out.append("=" * 100)
    out.append(f"bench  {results.get('command')}   ({results.get('elapsed_s')} s)")
    out.append(
        f"machine: {m.get('cpus')} CPUs {m.get('cpu_model')}, load average at start {fmt_load(m.get('loadavg_start'))}, "
        f"at end {fmt_load(m.get('loadavg_end'))}"
    )
    out.append(
        f"versions: router {v.get('model-router')} (git {v.get('git')}), litellm {v.get('litellm') or '-'}, "
        f"aiohttp {v.get('aiohttp')}, starlette {v.get('starlette')}, hypercorn {v.get('hypercorn')}, "
        f"uvloop {v.get('uvloop')}"
    )
    for name, why in (results.get("unavailable") or {}).items():
        out.append(f"NOT MEASURED: {LABELS.get(name, name)}: {why}")
    if results.get("error"):
        out.append(f"RUN FAILED: {results['error']}")
    if results.get("interrupted"):
        out.append("RUN INTERRUPTED: partial figures")

    procs = results.get("processes") or []
    if procs:
        out.append("")
        out.append("Server processes and their peak RSS (VmHWM over the whole run)")
        for p in sorted(procs, key=lambda p: _order(p["name"])):
            rss = f"{p['peak_rss_kb'] / 1024:7.1f} MB" if p.get("peak_rss_kb") else "      ? MB"
            out.append(f"  {p['name']:<12} {rss}   {p['role']}")

    lat = results.get("latency_1_client") or {}
    if lat.get("failed"):
        out.append(f"\n1-client latency: {lat['failed']}")
    elif lat.get("targets"):
        out.append("")
        out.append(
            f"1 client, interleaved ({lat['rounds']} rounds of {lat['round_seconds']} s per target and mode); "
            "added = target minus emulator direct"
        )
        out.append(f"  {'':<16} {'non-stream':^44} | {'stream: time to first content':^34}")
        out.append(
            f"  {'target':<16} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>9} {'+p99 ms':>9} | "
            f"{'n':>6} {'p50 ms':>8} {'+p50 ms':>9} {'+p99 ms':>8}"
        )
        for name in NAMES:
            entry = lat["targets"].get(name)
            if not entry:
                continue
            ns, st = entry.get("nonstream", {}), entry.get("stream", {})
            nl, added = ns.get("latency_ms", {}), ns.get("added_ms", {})
            tt, tadd = st.get("ttft_ms", {}), st.get("ttft_added_ms", {})
            errors = (ns.get("errors") or 0) + (st.get("errors") or 0)
            out.append(
                f"  {LABELS[name]:<16} {ns.get('requests', 0):>6} {_cell(nl.get('p50'), 8, 2)} {_cell(nl.get('p99'), 8, 2)} "
                f"{_cell(added.get('p50'), 9, 2)} {_cell(added.get('p99'), 9, 2)} | {st.get('requests', 0):>6} "
                f"{_cell(tt.get('p50'), 8, 2)} {_cell(tadd.get('p50'), 9, 2)} {_cell(tadd.get('p99'), 8, 2)}"
                + (f"   errors {errors}" if errors else "")
            )

    runs = results.get("throughput") or []
    if runs:
        present = [n for n in NAMES if any(r["target"] == n for r in runs)]
        clients = _clients(results)
        head = "".join(f"{LABELS[n]:>17}" for n in present)
        out.append("")
        out.append("Throughput, closed loop, req/s (p50 / p99 latency ms below)      ratios: gateway / other")
        rounds = max((len(r.get("rounds_rps") or []) for r in runs), default=1)
        if rounds > 1:
            out.append(
                f"  each figure: the median of {rounds} rounds (targets interleaved); a ratio: the median of the"
                " rounds' ratios"
            )
        out.append(f"  {'mode':<11}{'clients':>7}{head}{'gw/litellm':>12}{'gw/portkey':>12}{'gw/bare':>9}")
        for stream in (False, True):
            for c in clients:
                cells, lats = [], []
                for n in present:
                    run = _run(results, n, stream, c)
                    if run is None:
                        cells.append(f"{'-':>17}")
                        lats.append(f"{'':>17}")
                        continue
                    mark = " !" if run.get("errors") else ""
                    cells.append(f"{run.get('rps', 0):>15.1f}{mark:<2}")
                    lm = run.get("latency_ms", {})
                    lats.append(f"{lm.get('p50', 0):>8.1f} /{lm.get('p99', 0):>7.1f}")
                row: dict[str, Any] = next(
                    (r for r in results.get("ratios", []) if r["stream"] == stream and r["clients"] == c), {}
                )
                mode = "stream" if stream else "non-stream"
                out.append(
                    f"  {mode:<11}{c:>7}{''.join(cells)}{_ratio(row.get('gateway_over_litellm'), 12)}"
                    f"{_ratio(row.get('gateway_over_portkey'), 12)}{_pct(row.get('gateway_over_bare'), 9)}"
                )
                out.append(f"  {'':<18}{''.join(lats)}")
        if any(r.get("errors") for r in runs):
            out.append("  (! = some requests failed: see the caveats below and 'error_kinds' in bench.json)")

        out.append("")
        out.append("Streams under load: time to first content p50 ms (+ overhead over emulator direct)")
        out.append(f"  {'clients':>7}{head}")
        for c in clients:
            base = (_run(results, "direct", True, c) or {}).get("ttft_ms", {}).get("p50")
            cells = []
            for n in present:
                t = (_run(results, n, True, c) or {}).get("ttft_ms", {}).get("p50")
                text = (
                    "-"
                    if t is None
                    else f"{t:.1f}" + ("" if base is None or n == "direct" else f" ({t - base:+.1f})")
                )
                cells.append(f"{text:>17}")
            out.append(f"  {c:>7}{''.join(cells)}")

        out.append("")
        out.append(
            "CPU time per request of the server process, us, over the window (less sensitive to noise than req/s)"
        )
        out.append(f"  {'mode':<11}{'clients':>7}{head}")
        for stream in (False, True):
            for c in clients:
                cells = [
                    _cell((_run(results, n, stream, c) or {}).get("server_cpu_us_per_req"), 17, 0)
                    for n in present
                ]
                out.append(f"  {'stream' if stream else 'non-stream':<11}{c:>7}{''.join(cells)}")

        warnings = []
        for run in runs:
            label = f"{LABELS.get(run['target'], run['target'])}, {'stream' if run['stream'] else 'non-stream'}, {run['clients']} clients"
            if "failed" in run:
                warnings.append(f"{label}: {run['failed']}")
                continue
            if run.get("errors"):
                warnings.append(f"{label}: {run['errors']} failed requests {run.get('error_kinds')}")
            if run.get("requests", 0) < FEW_SAMPLES:
                warnings.append(
                    f"{label}: only {run.get('requests', 0)} requests in the window: a rough figure"
                )
            if (run.get("loadgen_cpu_share") or 0) >= LOADGEN_BUSY:
                warnings.append(
                    f"{label}: load generator used {run['loadgen_cpu_share']:.0%} of a CPU: "
                    "it may be the bottleneck; the figure is a floor"
                )
        if warnings:
            out.append("")
            out.append("Caveats")
            out += [f"  - {w}" for w in warnings]

    alt = [r for r in results.get("ratios", []) if any(k.startswith("gw-") for k in r)]
    if alt:
        out.append("")
        out.append("Other ways to run the gateway (same features): throughput ratios")
        names = [f"{LABELS[a]}/{LABELS[b]}" for a, b in ALT_RATIOS]
        out.append(f"  {'mode':<11}{'clients':>7}" + "".join(f"{n:>26}" for n in names))
        for r in alt:
            cells = []
            for a, b in ALT_RATIOS:
                v = r.get(f"{a}_over_{b}")
                cells.append(_pct(v, 26) if b.startswith("bare") else _ratio(v, 26))
            out.append(f"  {'stream' if r['stream'] else 'non-stream':<11}{r['clients']:>7}{''.join(cells)}")

    if results.get("budget"):
        out.append("")
        out.append("Budget (docs/architecture.md)")
        for b in results["budget"]:
            value = b["value"]
            shown = "-" if value is None else (f"{value:+.2f} ms" if b["unit"] == "ms" else f"{value:.2f}x")
            verdict = "n/a" if b["pass"] is None else ("PASS" if b["pass"] else "FAIL")
            out.append(f"  {verdict:<5} {b['check']:<62} {shown:>10}")
        out.append("  not measured here: " + "; ".join(results.get("not_measured", [])))
    out.append("=" * 100)
    return "\n".join(out)


def fmt_load(value: Any) -> str:
    return " ".join(f"{x:.2f}" for x in value) if value else "?"


def _ratio(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width - 1}.1f}x"


def _pct(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value * 100:>{width - 1}.0f}%"


def plot(results: dict[str, Any], venv: Any, json_path: Path, png_path: Path) -> str:
    """Draws bench.png with .bench-venv's matplotlib; returns a line saying what happened."""
    png_path.unlink(missing_ok=True)
    if venv is None or not venv.matplotlib:
        reason = venv.matplotlib_problem if venv is not None else "no .bench-venv"
        return f"chart: skipped ({reason})"
    script = Path(__file__).with_name("plot.py")
    try:
        done = subprocess.run(
            [str(venv.python), str(script), str(json_path), str(png_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"chart: failed ({exc})"
    if done.returncode != 0 or not png_path.exists():
        return f"chart: failed ({(done.stderr or done.stdout).strip().splitlines()[-1:]})"
    return f"chart: {png_path}   figures: {json_path}"
