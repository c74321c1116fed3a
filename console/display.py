"""How the console shows numbers and times.

- Credits: a column of amounts is shown with one number of decimals for all its cells, enough for its
  typical (median) non-zero amount to keep three significant digits (at least 2, at most 9:
  nano-credits), with thousands separators; an amount too small for them reads ``<0.01``; the exact
  amount is in each cell's ``title`` (and in the CSV). A figure on its own gets its own decimals.
- Times: in the zone the admin chose (UTC unless they picked another, :mod:`console.prefs`), as
  ``2026-11-23 07:53:07`` with the zone named in the column's heading; ``<time datetime>`` carries the
  instant in ISO 8601 (UTC), as the CSV does.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from zoneinfo import ZoneInfo

from core.catalog import NANO
from core.money import to_credits

UTC = ZoneInfo("UTC")
MIN_PLACES, MAX_PLACES = 2, 9


def places(amounts: Iterable[int | None] | int) -> int:
    """The decimals a column of nano-credit amounts (or one amount) is shown with: three significant
    digits of its typical amount (the median of the non-zero ones), so that one tiny call does not
    turn a column of whole credits into nine decimals (it shows as ``<0.01``, exact on hover)."""
    if isinstance(amounts, int):
        amounts = [amounts]
    given = sorted(abs(a) for a in amounts if a)
    if not given:
        return MIN_PLACES
    typical = given[len(given) // 2]
    digits = 2 - math.floor(math.log10(typical / NANO))  # decimals for three significant digits
    return max(MIN_PLACES, min(MAX_PLACES, digits))


def fixed(nano: int | None, decimals: int = MIN_PLACES) -> str:
    """``nano`` nano-credits as credits with ``decimals`` decimals (rounded half up) and separators;
    an amount too small for them is ``<0.01`` (at 2 decimals), never a misleading 0."""
    if nano is None:
        return ""
    sign = "-" if nano < 0 else ""
    scale = 10 ** (9 - decimals)
    units = (abs(nano) + scale // 2) // scale  # in 10**-decimals credits
    if nano and not units:
        return (
            f"{'>-' if nano < 0 else '<'}0.{'0' * (decimals - 1)}1"
            if decimals
            else f"{'>-' if nano < 0 else '<'}1"
        )
    whole, frac = divmod(units, 10**decimals)
    return f"{sign}{whole:,}" + (f".{frac:0{decimals}d}" if decimals else "")


def exact(nano: int | None) -> str:
    """The exact amount (for a ``title`` and the CSV)."""
    return "" if nano is None else to_credits(nano)


def count(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def ms(value: float | None) -> str:
    """A duration in milliseconds, to a precision that suits it."""
    if value is None:
        return "—"
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    if value >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms"


def percent(part: float, whole: float) -> str:
    if not whole:
        return "—"
    share = 100 * part / whole
    return f"{share:.1f} %" if share >= 0.1 or share == 0 else "< 0.1 %"


def local(ts: float, zone: ZoneInfo) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts, zone)


def when(ts: float | None, zone: ZoneInfo = UTC) -> str:
    return "" if ts is None else local(ts, zone).strftime("%Y-%m-%d %H:%M:%S")


def iso(ts: float | None) -> str:
    """ISO 8601 in UTC, to the millisecond (the CSV, ``<time datetime>``)."""
    if ts is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def zone_label(zone: ZoneInfo, ts: float | None = None) -> str:
    """How a zone is named in headings: ``UTC`` or ``Europe/Paris (CET)``."""
    if zone.key == "UTC":
        return "UTC"
    abbreviation = local(ts if ts is not None else 0.0, zone).tzname() if ts is not None else ""
    return f"{zone.key} ({abbreviation})" if abbreviation else zone.key
