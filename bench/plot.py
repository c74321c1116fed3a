"""Bar charts of bench.json; run with .bench-venv's python (matplotlib lives there, not in .venv).

.bench-venv/bin/python bench/plot.py bench/results/bench.json bench/results/bench.png
"""

from __future__ import annotations

import json
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PALETTE = ["#999999", "#1f77b4", "#2ca02c", "#17becf", "#98df8a", "#9467bd", "#d62728", "#8c564b"]


def main(src: str, dst: str) -> None:
    with open(src) as f:
        results: dict[str, Any] = json.load(f)
    labels: dict[str, str] = results["labels"]  # the targets in order, as bench/report.py names them
    colors = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(labels)}
    runs = [r for r in results.get("throughput") or [] if "failed" not in r]
    settings = sorted({(r["stream"], r["clients"]) for r in runs})
    present = [n for n in labels if any(r["target"] == n for r in runs)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / max(1, len(present))
    for i, name in enumerate(present):
        values = []
        for stream, clients in settings:
            run = next(
                (
                    r
                    for r in runs
                    if r["target"] == name and r["stream"] == stream and r["clients"] == clients
                ),
                None,
            )
            values.append(run["rps"] if run else 0)
        xs = [j + i * width for j in range(len(settings))]
        bars = ax1.bar(xs, values, width, label=labels[name], color=colors[name])
        ax1.bar_label(bars, fmt="%.0f", fontsize=7)
    ax1.set_xticks([j + width * (len(present) - 1) / 2 for j in range(len(settings))])
    ax1.set_xticklabels([f"{'stream' if s else 'non-stream'}\n{c} clients" for s, c in settings])
    ax1.set_ylabel("requests / s")
    ax1.set_title("Throughput (closed loop)")
    ax1.legend()

    lat = (results.get("latency_1_client") or {}).get("targets", {})
    names = [n for n in labels if n != "direct" and "added_ms" in lat.get(n, {}).get("nonstream", {})]
    for k, p in enumerate(("p50", "p99")):
        values = [lat[n]["nonstream"]["added_ms"][p] for n in names]
        bars = ax2.bar([j + k * 0.4 for j in range(len(names))], values, 0.4, label=p)
        ax2.bar_label(bars, fmt="%.2f", fontsize=7)
    ax2.set_xticks([j + 0.2 for j in range(len(names))])
    ax2.set_xticklabels([labels[n] for n in names], rotation=20, ha="right")
    ax2.set_yscale("symlog", linthresh=1)
    ax2.set_ylabel("ms added over calling the emulator directly")
    ax2.set_title("Added latency, 1 client, non-stream")
    ax2.legend()
    fig.suptitle(f"{results.get('command', '')}   ({results.get('started_at', '')})", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
