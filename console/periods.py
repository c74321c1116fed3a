"""Periods and the chart's time buckets, in the admin's time zone.

A period is a preset (the last 24 hours, 7, 30 or 90 days, all time) or a range of dates (``from`` /
``to``, either may be left out: typing a date is enough, no menu to change as well). A period is cut
into buckets on the clock of the zone shown: hours (1, 3, 6 or 12 of them, starting at a multiple of
that many hours), days (from midnight), weeks (from Monday) or months (from the 1st), each labelled by
its true start. A preset covers whole buckets up to the one holding ``now`` (the last 24 hours are the
24 hourly buckets up to this one), so the first bar is never a cut-off one.

The figures come from hourly totals (billing/analysis.py), so bucket edges fall on whole UTC hours: in a
zone whose offset is not a whole number of hours (India, Nepal, parts of Australia) a bucket starts at
the whole UTC hour before its local edge, and its label says so (``05:30``).
"""

from __future__ import annotations

import bisect
import datetime
import math
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from console.forms import Invalid

HOUR, DAY = 3600, 86400
MAX_BUCKETS = 92
PRESETS: dict[str, tuple[str, str, int, int]] = {  # key: (label, unit, step, buckets)
    "24h": ("Last 24 hours", "hour", 1, 24),
    "7d": ("Last 7 days", "hour", 3, 56),
    "30d": ("Last 30 days", "day", 1, 30),
    "90d": ("Last 90 days", "day", 1, 90),
}
# (unit, step, rough seconds) from the finest to the coarsest: a range gets the first that fits
UNITS = [
    ("hour", 1, HOUR),
    ("hour", 3, 3 * HOUR),
    ("hour", 6, 6 * HOUR),
    ("hour", 12, 12 * HOUR),
    ("day", 1, DAY),
    ("week", 1, 7 * DAY),
    ("month", 1, 30 * DAY),
    ("month", 3, 91 * DAY),
    ("month", 12, 365 * DAY),
]
CHOICES = [*PRESETS, "all"]


@dataclass(frozen=True, slots=True)
class Period:
    key: str  # a preset, "all" or "custom"
    since: float | None  # None: from the first call
    until: float | None  # exclusive; None: up to now
    start: str = ""  # the custom dates as typed (YYYY-MM-DD)
    end: str = ""

    @property
    def label(self) -> str:
        if self.key in PRESETS:
            return PRESETS[self.key][0]
        if self.key == "all":
            return "All time"
        return f"{self.start or 'the first call'} to {self.end or 'now'}"


def day_start(text: str, field: str, zone: ZoneInfo) -> float:
    """Local midnight of the date ``text`` (YYYY-MM-DD)."""
    try:
        date = datetime.date.fromisoformat(text)
    except ValueError:
        raise Invalid(field, "Use a date as YYYY-MM-DD.") from None
    if not 1970 < date.year < 9999:
        raise Invalid(field, "Use a date between 1971 and 9998.")
    return datetime.datetime(date.year, date.month, date.day, tzinfo=zone).timestamp()


def choose(params: dict[str, str], zone: ZoneInfo, now: float, default: str = "7d") -> Period:
    """The period a query string asks for: its dates if it has any, else its preset."""
    start, end = params.get("from", "").strip(), params.get("to", "").strip()
    if start or end:
        since = day_start(start, "from", zone) if start else None
        until = None
        if end:  # up to the end of that day, by the clock (a DST day has 23 or 25 hours)
            last = day_start(end, "to", zone)
            until = shift(floor(last, "day", 1, zone), "day", 1, 1, zone)
        if since is not None and until is not None and until <= since:
            raise Invalid("to", "The end date must not be before the start date.")
        return Period("custom", since, until, start, end)
    key = params.get("period", "") or default
    if key == "all":
        return Period("all", None, None)
    if key not in PRESETS:
        raise Invalid("period", "Pick a period from the list.")
    _, unit, step, count = PRESETS[key]
    last = floor(now, unit, step, zone)
    return Period(key, shift(last, unit, step, -(count - 1), zone), None)


# -- the clock of a zone ----------------------------------------------------------------------------
def floor(ts: float, unit: str, step: int, zone: ZoneInfo) -> float:
    """The start of the bucket of ``unit`` x ``step`` holding ``ts``."""
    t = datetime.datetime.fromtimestamp(ts, zone)
    if unit == "hour":
        t = t.replace(hour=t.hour - t.hour % step, minute=0, second=0, microsecond=0)
    elif unit == "day":
        t = t.replace(hour=0, minute=0, second=0, microsecond=0)
    elif unit == "week":
        t = (t - datetime.timedelta(days=t.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        month = (t.month - 1) - (t.month - 1) % step + 1
        t = t.replace(month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    return _utc_hour(_wall(t, zone))


def shift(ts: float, unit: str, step: int, n: int, zone: ZoneInfo) -> float:
    """``n`` buckets of ``unit`` x ``step`` after (or before) the bucket start ``ts``."""
    if unit == "hour":
        return ts + n * step * HOUR
    t = datetime.datetime.fromtimestamp(ts, zone).replace(tzinfo=None)
    if unit == "day":
        t += datetime.timedelta(days=n * step)
    elif unit == "week":
        t += datetime.timedelta(weeks=n * step)
    else:
        months = t.year * 12 + t.month - 1 + n * step
        t = t.replace(year=months // 12, month=months % 12 + 1)
    return _utc_hour(_wall(t, zone))


def _wall(t: datetime.datetime, zone: ZoneInfo) -> float:
    """The instant a wall-clock time of ``zone`` names (its first occurrence; a time skipped by a
    DST change names the instant of the change)."""
    return t.replace(tzinfo=zone, fold=0).timestamp()


def _utc_hour(ts: float) -> float:
    return math.floor(ts / HOUR) * HOUR


# -- buckets ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Buckets:
    edges: list[float]  # n + 1 UTC instants, on whole hours
    unit: str
    step: int
    zone: ZoneInfo

    def __len__(self) -> int:
        return len(self.edges) - 1

    def index(self, ts: float) -> int | None:
        """The bucket holding ``ts``, if one does."""
        i = bisect.bisect_right(self.edges, ts) - 1
        return i if 0 <= i < len(self) else None

    def label(self, i: int, long: bool = False) -> str:
        """Bucket ``i``'s start on the zone's clock (``long``: with its date and end, for a tooltip)."""
        start = datetime.datetime.fromtimestamp(self.edges[i], self.zone)
        if not long:
            if self.unit == "hour":
                return start.strftime("%H:%M") if start.hour or start.minute else start.strftime("%b %d")
            return start.strftime("%b %Y" if self.unit == "month" else "%b %d")
        end = datetime.datetime.fromtimestamp(self.edges[i + 1], self.zone)
        if self.unit == "hour":
            return f"{start:%a %Y-%m-%d %H:%M}–{end:%H:%M}"
        if self.unit == "day":
            return f"{start:%a %Y-%m-%d}"
        if self.unit == "week":
            return f"Week of {start:%a %Y-%m-%d}"
        return (
            f"{start:%B %Y}" if self.step == 1 else f"{start:%b %Y}–{end - datetime.timedelta(days=1):%b %Y}"
        )

    def ticks(self, most: int = 8) -> list[int]:
        """The buckets to label on the axis: evenly spaced, on round clock times where they can be."""
        n = len(self)
        every = next((k for k in (1, 2, 3, 4, 6, 8, 12, 24, 48) if n / k <= most), math.ceil(n / most))
        if self.unit == "hour":
            period = every * self.step  # hours between labels: put them where the clock is a multiple
            first = next(
                (
                    i
                    for i in range(min(n, every))
                    if datetime.datetime.fromtimestamp(self.edges[i], self.zone).hour % period == 0
                ),
                0,
            )
        else:
            first = 0
        return list(range(first, n, every))


def buckets(since: float, until: float, zone: ZoneInfo, unit: str | None = None, step: int = 1) -> Buckets:
    """The buckets covering ``[since, until)``: of ``unit`` x ``step``, or of the finest unit that
    needs at most ``MAX_BUCKETS``."""
    if unit is None:
        unit, step = next(
            ((u, s) for u, s, size in UNITS if (until - since) / size <= MAX_BUCKETS), UNITS[-1][:2]
        )
    edges = [floor(since, unit, step, zone)]
    while edges[-1] < until and len(edges) <= 4 * MAX_BUCKETS:
        following = shift(edges[-1], unit, step, 1, zone)
        edges.append(following if following > edges[-1] else edges[-1] + HOUR)
    return Buckets(edges, unit, step, zone)


def for_period(period: Period, first: float | None, now: float, zone: ZoneInfo) -> Buckets | None:
    """The chart's buckets for ``period`` (``first``: the first call's time, for "all time")."""
    if period.key in PRESETS:
        _, unit, step, _ = PRESETS[period.key]
        assert period.since is not None
        return buckets(period.since, now, zone, unit, step)
    since = period.since if period.since is not None else first
    until = period.until if period.until is not None else now
    if since is None or until <= since:
        return None
    return buckets(since, until, zone)
