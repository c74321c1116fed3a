"""The admin's display choice: times in UTC or in a time zone of theirs.

It is a cookie (``mr_tz``: an IANA zone name, e.g. ``Europe/Paris``), set by a form: the header's
UTC / local switch (``console.js`` puts the browser's zone in it) or the display page, which lists
every zone for a browser without JavaScript. Anything that is not a known zone means UTC.
"""

from __future__ import annotations

import functools
import zoneinfo
from zoneinfo import ZoneInfo

from starlette.requests import Request

COOKIE = "mr_tz"
YEAR = 365 * 86400


@functools.cache
def zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


@functools.lru_cache(maxsize=64)
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name if name in zones() else "UTC")


def zone_of(request: Request) -> ZoneInfo:
    return zone(request.cookies.get(COOKIE, "UTC"))


def valid(name: str) -> bool:
    return name == "UTC" or name in zones()
