"""Reading a key's lifecycle fields as an operator gives them (the console's forms, the admin API, the
CLI): an expiry, a rotation's grace period, tags and an owner. Each parser returns a value or raises
:class:`console.forms.Invalid` naming the field: an expiry in the past, a negative grace period or a
tag with spaces is a clear 400 (the CLI prints its message on one line)."""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

from billing.store import KeyMeta
from console.forms import Invalid
from core.inputs import finite

DURATION = re.compile(r"^(\d{1,9})\s*([smhdw])$")
UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/=-]{0,63}$")
MAX_TAGS = 20
MAX_OWNER = 200
MAX_GRACE = 30 * 86400.0
# the console's rotation keeps the old secret this long unless the operator says otherwise: a day is
# enough to roll a secret out to the callers that hold it, and the old one still ends on its own
ROTATE_GRACE = "24h"
MAX_TIME = 1e11  # year 5138: within every column's range


def duration(text: str) -> float | None:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"3600s"``, ``"2w"`` in seconds; None if it is not one."""
    m = DURATION.match(text.strip().lower())
    return int(m.group(1)) * UNIT[m.group(2)] if m else None


def expiry(value: Any, field: str = "expires_at", now: float | None = None) -> float | None:
    """An expiry: None / "" / "never" for none; epoch seconds; an ISO 8601 date or time (UTC unless it
    says otherwise); or a duration from now ("30d"). It must be in the future."""
    now = time.time() if now is None else now
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "never", "none")):
        return None
    at: float | None
    if isinstance(value, bool):
        at = None
    elif isinstance(value, int | float):
        at = finite(str(value))
    elif isinstance(value, str):
        text = value.strip()
        relative = duration(text)
        at = now + relative if relative is not None else _moment(text)
    else:
        at = None
    if at is None or not 0 <= at <= MAX_TIME:
        raise Invalid(
            field,
            f"'{field}' must be a time: epoch seconds, an ISO 8601 date or time "
            "(2027-01-31 or 2027-01-31T12:00:00Z), a duration from now (30d, 12h), or null.",
        )
    if at <= now:
        raise Invalid(field, f"'{field}' is in the past ({_iso(at)}): give a time after now ({_iso(now)}).")
    return at


def _moment(text: str) -> float | None:
    number = finite(text)
    if number is not None:
        return number
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def grace(value: Any, field: str = "grace_seconds") -> float:
    """A rotation's grace period: seconds (a number) or a duration ("1h"), 0 to 30 days."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = duration(value)
        if seconds is None:
            seconds = finite(value.strip())
    if seconds is None or seconds != seconds:
        raise Invalid(field, f"'{field}' must be a number of seconds or a duration (90s, 15m, 1h, 7d).")
    if seconds < 0:
        raise Invalid(field, f"'{field}' cannot be negative: 0 ends the old secret at once.")
    if seconds > MAX_GRACE:
        raise Invalid(field, f"'{field}' is at most 30 days ({MAX_GRACE:.0f} seconds).")
    return seconds


def tags(value: Any, field: str = "tags") -> tuple[str, ...]:
    """Tags: a list of strings, or one string separated by commas or spaces."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [t for t in re.split(r"[,\s]+", value) if t]
    elif isinstance(value, list) and all(isinstance(t, str) for t in value):
        items = [t.strip() for t in value if t.strip()]
    else:
        raise Invalid(field, f"'{field}' must be a list of strings.")
    bad = [t for t in items if not TAG.match(t)]
    if bad:
        raise Invalid(field, f"Not a tag: {bad[0][:40]!r} (letters, digits and . _ : / = -, at most 64).")
    unique = tuple(dict.fromkeys(items))
    if len(unique) > MAX_TAGS:
        raise Invalid(field, f"At most {MAX_TAGS} tags.")
    return unique


def owner(value: Any, field: str = "owner") -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value.strip()) > MAX_OWNER or any(ord(c) < 32 for c in value):
        raise Invalid(field, f"'{field}' is at most {MAX_OWNER} printable characters.")
    return value.strip()


def meta_of(data: dict[str, Any], base: KeyMeta | None = None) -> KeyMeta:
    """The lifecycle fields in ``data`` (absent ones from ``base``)."""
    base = base or KeyMeta()
    return KeyMeta(
        expiry(data["expires_at"]) if "expires_at" in data else base.expires_at,
        tags(data["tags"]) if "tags" in data else base.tags,
        owner(data["owner"]) if "owner" in data else base.owner,
    )


def grace_text(seconds: float) -> str:
    """A grace period as an operator reads it: ``at once``, ``for 90 seconds``, ``for 15 minutes``,
    ``for 24 hours``, ``for 7 days`` (the largest unit that divides it, counted at least twice)."""
    if seconds <= 0:
        return "at once"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= 2 * size:
            n = int(seconds // size)
            return f"for {n} {unit}{'s' if n != 1 else ''}"
    return f"for {seconds:g} second{'s' if seconds != 1 else ''}"
