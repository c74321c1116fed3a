"""The usage chart: credits (bars, left axis) and calls (line, right axis) per time bucket, drawn on the
server as inline SVG. No script, no external asset.

Axes end on round numbers (steps of 1, 2, 2.5 or 5 times a power of ten; whole calls), bucket labels
are the buckets' true starts on the zone's clock (:mod:`console.periods`), at round clock times.
Hovering a bucket (anywhere over its column) highlights it and shows its figures (an SVG ``<title>``);
the same figures are in a table below the chart, for screen readers and for copying. A period without
calls gets a line saying so, not an empty frame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from zoneinfo import ZoneInfo

from console import display
from console.periods import Buckets
from core.catalog import NANO

# viewBox width and height, labels on the time axis, width of a character of the axes' text
SIZES = {"wide": (920, 290, 8, 7.0), "narrow": (420, 270, 4, 9.0)}
TOP, BOTTOM = 14, 46
TICKS = 4


@dataclass(frozen=True, slots=True)
class Point:
    calls: int
    credits: int  # nano-credits
    failed: int  # failed or rejected


def nice_step(maximum: float, whole: bool = False) -> float:
    """A round step for about ``TICKS`` ticks up to ``maximum``."""
    if maximum <= 0:
        return 1.0
    raw = maximum / TICKS
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10):
        if m * exp >= raw - 1e-12:
            step = m * exp
            return max(1.0, round(step)) if whole else step
    return 10 * exp  # (not reached)


def _decimals(step: float) -> int:
    """Decimals that show every multiple of ``step`` exactly."""
    for d in range(0, 10):
        if abs(round(step, d) - step) < 1e-12 * max(1.0, step):
            return d
    return 9


def _credits_tick(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def empty(zone: ZoneInfo) -> str:
    return '<p class="empty chart-empty">No calls in this period.</p>'


def svg(b: Buckets, points: Sequence[Point], title: str) -> str:
    """The chart (drawn twice: for wide and for narrow screens, the stylesheet shows one) and its
    data table, or an empty-state line."""
    zone = display.zone_label(b.zone, b.edges[0])
    if not any(p.calls for p in points):
        return empty(b.zone)
    drawings = "".join(_draw(b, points, title, zone, size) for size in SIZES)
    return drawings + table(b, points, zone)


def _draw(b: Buckets, points: Sequence[Point], title: str, zone: str, size: str) -> str:
    W, H, most, char = SIZES[size]
    credits = [p.credits / NANO for p in points]
    credit_step = nice_step(max(credits))
    credit_max = credit_step * max(1, math.ceil(max(credits) / credit_step - 1e-9))
    call_step = nice_step(max(p.calls for p in points), whole=True)
    call_max = call_step * max(1, math.ceil(max(p.calls for p in points) / call_step))
    decimals = _decimals(credit_step)
    labels = [_credits_tick(credit_step * i, decimals) for i in range(TICKS + 2)]
    left = 16 + char * max(len(label) for label in labels)
    right = 16 + char * len(f"{int(call_max):,}")
    plot_w, plot_h = W - left - right, H - TOP - BOTTOM
    n = len(points)
    step = plot_w / n
    bar = max(step * 0.72, 1.0)
    out = [
        f'<svg class="chart {size}" role="img" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg" '
        f'aria-labelledby="chart-title-{size}"><title id="chart-title-{size}">{escape(title)}</title>'
    ]
    ticks = int(round(credit_max / credit_step))
    for i in range(ticks + 1):
        y = TOP + plot_h * (1 - i / ticks)
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{W - right}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="axis credits" x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_credits_tick(credit_step * i, decimals)}</text>"
        )
    call_ticks = int(round(call_max / call_step))
    for i in range(call_ticks + 1):
        y = TOP + plot_h * (1 - i / call_ticks)
        out.append(
            f'<text class="axis calls" x="{W - right + 8}" y="{y + 4:.1f}">{int(call_step * i):,}</text>'
        )
    line: list[str] = []
    for i, p in enumerate(points):
        x = left + i * step
        h = plot_h * credits[i] / credit_max
        cx, cy = x + step / 2, TOP + plot_h * (1 - p.calls / call_max)
        line.append(f"{cx:.1f},{cy:.1f}")
        tip = (
            f"{b.label(i, long=True)} ({zone}): {p.calls:,} calls"
            f"{f' ({p.failed:,} failed or rejected)' if p.failed else ''}, {display.exact(p.credits)} credits"
        )
        out.append(
            f'<g class="bucket"><rect class="hit" x="{x:.1f}" y="{TOP}" width="{step:.1f}" height="{plot_h}"/>'
            f'<rect class="bar" x="{x + (step - bar) / 2:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar:.1f}" '
            f'height="{h:.1f}"/><title>{escape(tip)}</title></g>'
        )
    out.append(f'<polyline class="line" points="{" ".join(line)}"/>')
    if n <= (45 if size == "wide" else 24):
        out += [
            f'<circle class="dot" cx="{pt.split(",")[0]}" cy="{pt.split(",")[1]}" r="2.5"/>' for pt in line
        ]
    out.append(
        f'<line class="axisline" x1="{left}" y1="{TOP + plot_h}" x2="{W - right}" y2="{TOP + plot_h}"/>'
    )
    for i in b.ticks(most):
        x = left + i * step
        out.append(
            f'<line class="tick" x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}"/>'
        )
        out.append(
            f'<text class="axis" x="{x:.1f}" y="{H - BOTTOM + 19}" text-anchor="start">{escape(b.label(i))}</text>'
        )
    out.append(f'<text class="legend credits" x="{left}" y="{H - 8}">▮ credits (left)</text>')
    out.append(f'<text class="legend calls" x="{left + 16 * char}" y="{H - 8}">● calls (right)</text>')
    if size == "wide":
        out.append(
            f'<text class="legend" x="{W - right}" y="{H - 8}" text-anchor="end">{escape(zone)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def table(b: Buckets, points: Sequence[Point], zone: str) -> str:
    """The chart's figures as a table (folded away under the chart)."""
    rows = "".join(
        f'<tr data-start="{b.edges[i]:.0f}"><td>{escape(b.label(i, long=True))}</td><td class="num">{p.calls:,}</td>'
        f'<td class="num">{p.failed:,}</td><td class="num" title="{display.exact(p.credits)}">'
        f"{display.exact(p.credits)}</td></tr>"
        for i, p in enumerate(points)
    )
    return (
        '<details class="chart-data"><summary>The chart\'s figures</summary><div class="table-wrap" tabindex="0">'
        f'<table class="data" id="chart-data"><thead><tr><th scope="col">Bucket ({escape(zone)})</th>'
        '<th scope="col" class="num">Calls</th><th scope="col" class="num">Failed or rejected</th>'
        f'<th scope="col" class="num">Credits</th></tr></thead><tbody>{rows}</tbody></table></div></details>'
    )
