"""The usage chart: credits (bars, left axis) and calls (line, right axis) per time bucket, drawn on the
server as inline SVG. No script, no external asset; every bar has a ``<title>`` (a hover tooltip)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from html import escape

from billing.history import Bucket
from core.money import to_credits

WIDTHS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400, 30 * 86400)
MAX_BUCKETS = 60
W, H = 920, 280
LEFT, RIGHT, TOP, BOTTOM = 84, 64, 16, 40


def bucket_width(span: float) -> int:
    """The smallest standard bucket that covers ``span`` seconds in at most ``MAX_BUCKETS`` buckets."""
    for width in WIDTHS:
        if span / width <= MAX_BUCKETS:
            return width
    return int(math.ceil(span / MAX_BUCKETS))


def nice_max(value: float) -> float:
    """A round axis maximum at or above ``value``."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return float(step * exp)
    return float(10 * exp)


def _when(ts: float, width: float) -> str:
    d = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    if width >= 86400:
        return d.strftime("%Y-%m-%d")
    if width >= 3600:
        return d.strftime("%m-%d %H:00")
    return d.strftime("%H:%M")


def _credits_label(nano: float) -> str:
    return to_credits(int(round(nano)))


def svg(buckets: Sequence[Bucket], width: float, title: str = "Credits and calls over time") -> str:
    if not buckets:
        return ""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    max_credits = nice_max(max(b.credits for b in buckets))
    max_calls = nice_max(max(b.calls for b in buckets))
    if max_calls % 4:  # calls are whole: ticks at quarters of the axis should be too
        max_calls = float(4 * math.ceil(max_calls / 4))
    step = plot_w / len(buckets)
    bar = max(step * 0.7, 1.0)
    out = [
        f'<svg class="chart" role="img" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
    ]
    for i in range(5):  # grid and axis labels
        frac = i / 4
        y = TOP + plot_h * (1 - frac)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="axis credits" x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(_credits_label(max_credits * frac))}</text>"
        )
        calls = max_calls * frac
        calls_text = f"{calls:,.0f}" if calls == int(calls) else f"{calls:,.1f}"
        out.append(f'<text class="axis calls" x="{W - RIGHT + 8}" y="{y + 4:.1f}">{calls_text}</text>')
    points: list[str] = []
    labels_every = max(1, math.ceil(len(buckets) / 8))
    for i, b in enumerate(buckets):
        x = LEFT + i * step + (step - bar) / 2
        h = plot_h * b.credits / max_credits
        tip = f"{_when(b.start, width)}: {to_credits(b.credits)} credits, {b.calls} calls"
        out.append(
            f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar:.1f}" height="{h:.1f}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        cx = LEFT + i * step + step / 2
        cy = TOP + plot_h * (1 - b.calls / max_calls)
        points.append(f"{cx:.1f},{cy:.1f}")
        if i % labels_every == 0:
            out.append(
                f'<text class="axis" x="{cx:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">'
                f"{escape(_when(b.start, width))}</text>"
            )
    out.append(f'<polyline class="line" points="{" ".join(points)}"/>')
    for point in points:
        px, py = point.split(",")
        out.append(f'<circle class="dot" cx="{px}" cy="{py}" r="2.5"/>')
    out.append(
        f'<line class="axisline" x1="{LEFT}" y1="{TOP + plot_h}" x2="{W - RIGHT}" y2="{TOP + plot_h}"/>'
    )
    out.append(f'<text class="legend credits" x="{LEFT}" y="{H - 6}">■ credits (left)</text>')
    out.append(f'<text class="legend calls" x="{LEFT + 130}" y="{H - 6}">● calls (right)</text>')
    out.append("</svg>")
    return "".join(out)
