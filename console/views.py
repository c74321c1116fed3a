"""What several pages show alike: a period's chart and its totals, the latency figures, breakdowns
(tables of totals per model, key, group, ...), and the pager of a history."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any
from zoneinfo import ZoneInfo

from billing.analysis import Percentiles, Totals
from billing.history import Page
from billing.usage_filter import Filter
from console import charts, display, periods
from console.app import Console

COUNT_CAP = 100_000  # records counted one by one for "page N of M" when no rollup answers


@dataclass(slots=True)
class Summary:
    """A period's chart and figures."""

    chart: str
    totals: Totals
    latency: Percentiles | None
    since: float | None  # the period's start as shown (the first bucket's)
    buckets: periods.Buckets | None


async def summary(
    c: Console, f: Filter, period: periods.Period, zone: ZoneInfo, title: str, latency: bool = True
) -> Summary:
    """The chart of ``f`` over ``period`` (hourly totals put in the period's buckets), its totals and
    (``latency``) its latency percentiles."""
    now = time.time()
    first = await c.history.first_ts(f) if period.since is None else None
    b = periods.for_period(period, first, now, zone)
    if b is None:
        return Summary(charts.empty(zone), Totals(), None, period.since, None)
    f = replace(f, since=b.edges[0], until=period.until)
    hourly = await c.analysis.totals(f, ("hour",))
    points = [[0, 0, 0] for _ in range(len(b))]
    total = Totals()
    for (hour,), t in hourly.items():
        total.merge(t)
        i = b.index(float(hour))
        if i is not None:
            points[i][0] += t.calls
            points[i][1] += t.credits
            points[i][2] += t.errors + t.rejected
    chart = charts.svg(b, [charts.Point(*p) for p in points], title)
    figures = await c.analysis.latency(f, total.ok) if latency and total.ok else None
    return Summary(chart, total, figures, b.edges[0], b)


@dataclass(slots=True)
class Row:
    key: Any  # the value of the field broken down by
    label: str
    link: str
    totals: Totals
    share: float  # of the credits of all rows (0 to 1)


@dataclass(slots=True)
class Breakdown:
    title: str
    field: str
    rows: list[Row]
    places: int  # decimals of its credits column
    more: int  # rows left out
    more_link: str = ""  # where they are all listed


async def breakdown(
    c: Console, f: Filter, field: str, title: str, label: Any, link: Any, top: int = 10, more_link: str = ""
) -> Breakdown:
    """Totals of ``f`` per value of ``field``, most credits first (``label`` / ``link``: the text and
    the link of a value)."""
    totals = await c.analysis.totals(f, (field,))
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1].credits, -kv[1].calls, str(kv[0][0])))
    spent = sum(t.credits for t in totals.values()) or 1
    rows = [Row(k, label(k), link(k), t, t.credits / spent) for (k,), t in ranked[:top]]
    return Breakdown(
        title,
        field,
        rows,
        display.places(r.totals.credits for r in rows),
        max(0, len(ranked) - top),
        more_link,
    )


@dataclass(slots=True)
class Pager:
    page: int | None  # this page's number, when known
    pages: int | None  # how many there are, when known
    total: int  # records matching (COUNT_CAP + 1: more than COUNT_CAP)
    newer: int | None  # cursors
    older: int | None

    @property
    def capped(self) -> bool:
        return self.total > COUNT_CAP


async def page_of(
    c: Console, f: Filter, limit: int, page: int | None, before: int | None, after: int | None
) -> tuple[Page, Pager]:
    """A page of the history and where it is: its number (carried in the URL by the pager's links)
    and how many pages the filter has. The oldest page (``after=0``) is the last one: the records
    left over once the others are full."""
    if f.rolled:
        total = (await c.analysis.total(f)).calls
    else:
        total = await c.history.count(f, COUNT_CAP)
    pages = max(1, math.ceil(total / limit)) if total <= COUNT_CAP else None
    size = limit
    if before is None and after is None:
        page = 1
    elif after == 0:
        page = pages
        if pages is not None:
            size = total - (pages - 1) * limit or limit
    elif page is not None and pages is not None:
        page = min(page, pages)
    result = await c.history.history(f, size, before=before, after=after)
    return result, Pager(page, pages, total, result.newer, result.older)
