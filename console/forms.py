"""Reading what the admin typed: credit amounts, names, model lists, periods and history filters.

Every parser returns a value or raises ``Invalid`` with a message meant for the form; nothing here
crashes on bad input. Amounts are credits with up to 9 decimals, turned into nano-credits exactly
(``core.money.to_nano``) and shown back exactly (``core.money.to_credits``).
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qs, urlencode

from billing.history import Filter
from core.deployments import is_name
from core.inputs import group_name_problem, natural
from core.money import to_credits, to_nano

T = TypeVar("T")

MAX_FORM_BYTES = 64 * 1024
AMOUNT = re.compile(r"^\d{1,12}(\.\d{1,9})?$")
MODEL = re.compile(r"^[a-z0-9][a-z0-9._:/-]{0,127}$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
PERIODS: dict[str, tuple[str, float | None]] = {
    "24h": ("Last 24 hours", 86400.0),
    "7d": ("Last 7 days", 7 * 86400.0),
    "30d": ("Last 30 days", 30 * 86400.0),
    "90d": ("Last 90 days", 90 * 86400.0),
    "all": ("All time", None),
    "custom": ("From … to (UTC dates)", None),
}
SOURCES = {"all": None, "api": "api", "job": "job"}
PAGE_SIZES = (25, 50, 100, 200, 500)


class Invalid(ValueError):
    """Bad input, with the message to show next to the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def credits(text: str, field: str, *, positive: bool = False, allow_empty: bool = False) -> int | None:
    text = text.strip().replace("_", "")
    if not text:
        if allow_empty:
            return None
        raise Invalid(field, "Enter an amount of credits.")
    if not AMOUNT.match(text):
        raise Invalid(field, f"“{text[:40]}” is not an amount of credits: use digits, with up to 9 decimals.")
    try:
        nano = to_nano(text)
    except ValueError:
        raise Invalid(field, f"“{text[:40]}” is not an amount of credits: use digits, with up to 9 decimals.") from None
    if positive and nano <= 0:
        raise Invalid(field, "The amount must be more than zero.")
    return nano


def group_name(text: str, field: str) -> str:
    text = text.strip()
    problem = group_name_problem(text)
    if problem is not None:
        raise Invalid(field, problem)
    return text


def label(text: str, field: str) -> str:
    text = text.strip()
    if len(text) > 64 or any(ord(c) < 32 for c in text):
        raise Invalid(field, "A key label is at most 64 printable characters.")
    return text


def models(text: str, field: str, known: set[str]) -> list[str] | None:
    """A comma- or line-separated allow-list; empty means every model."""
    items = [m.strip().lower() for m in re.split(r"[,\s]+", text) if m.strip()]
    if not items:
        return None
    bad = [m for m in items if not MODEL.match(m)]
    if bad:
        raise Invalid(field, f"Not a model id: {bad[0][:60]!r}.")
    unknown = [m for m in items if known and m not in known]
    if unknown:
        raise Invalid(field, f"Unknown model {unknown[0]!r}: use ids as GET /v1/models lists them.")
    return sorted(set(items))


def show(nano: int | None) -> str:
    return "" if nano is None else to_credits(nano)


def form_data(body: bytes) -> dict[str, str]:
    """An urlencoded body as a dict of first values (a field sent twice keeps its first value)."""
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in parsed.items()}


def day(text: str, field: str) -> float:
    if not DATE.match(text):
        raise Invalid(field, "Use a date as YYYY-MM-DD.")
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%d")))
    except ValueError:
        raise Invalid(field, f"{text} is not a date.") from None


@dataclass(frozen=True, slots=True)
class Period:
    key: str
    since: float | None
    until: float | None
    start: str = ""  # the custom dates as typed
    end: str = ""

    @property
    def label(self) -> str:
        if self.key == "custom":
            return f"{self.start} to {self.end} (UTC)"
        return PERIODS[self.key][0]


def period(params: dict[str, str], default: str = "7d", now: float | None = None) -> Period:
    key = params.get("period", default) or default
    if key not in PERIODS:
        raise Invalid("period", "Pick a period from the list.")
    now = time.time() if now is None else now
    if key == "custom":
        start, end = params.get("from", "").strip(), params.get("to", "").strip()
        since = day(start, "from") if start else None
        until = day(end, "to") + 86400.0 if end else None  # the whole last day
        if since is not None and until is not None and until <= since:
            raise Invalid("to", "The end date must not be before the start date.")
        return Period(key, since, until, start, end)
    span = PERIODS[key][1]
    return Period(key, now - span if span is not None else None, None)


@dataclass(frozen=True, slots=True)
class History:
    """The usage page's query string, parsed."""

    source: str  # all | api | job
    period: Period
    model: str
    key_id: int | None
    limit: int
    before: int | None
    after: int | None
    deployment: str = ""  # the provider's deployment that served ("": any)

    def filter(self, group_id: int) -> Filter:
        return Filter(
            group_id,
            SOURCES[self.source],
            self.model or None,
            self.key_id,
            self.period.since,
            self.period.until,
            self.deployment or None,
        )

    def query(self, **changes: object) -> str:
        """This query string with some parameters changed (None drops one); cursors only if given."""
        values: dict[str, object] = {
            "source": self.source,
            "period": self.period.key,
            "from": self.period.start,
            "to": self.period.end,
            "model": self.model,
            "deployment": self.deployment,
            "key": self.key_id,
            "limit": self.limit,
        }
        values.update(changes)
        keep = {k: v for k, v in values.items() if v not in (None, "")}
        if keep.get("period") != "custom":
            keep.pop("from", None)
            keep.pop("to", None)
        if keep.get("limit") == 50:
            keep.pop("limit")
        return urlencode(keep)


def cursor(text: str, field: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    value = natural(text)
    if value is None:
        raise Invalid(field, "Not a page cursor.")
    return value


def history(params: dict[str, str], errors: dict[str, str]) -> History:
    """The filters of the usage page; a bad one is reported in ``errors`` and falls back to its default."""

    def take(field: str, parse: Callable[[], T], default: T) -> T:
        try:
            return parse()
        except Invalid as exc:
            errors[exc.field or field] = exc.message
            return default

    source = params.get("source", "all") or "all"
    if source not in SOURCES:
        errors["source"] = "The source is all, api or job."
        source = "all"
    chosen = take("period", lambda: period(params), period({}))
    model = params.get("model", "").strip().lower()
    if model and not MODEL.match(model):
        errors["model"] = "Not a model id."
        model = ""
    deployment = params.get("deployment", "").strip()
    if deployment and not is_name(deployment):
        errors["deployment"] = "Not a deployment name."
        deployment = ""
    key_id = take("key", lambda: cursor(params.get("key", ""), "key"), None)
    limit_text = params.get("limit", "50").strip() or "50"
    limit = natural(limit_text) or 50
    limit = limit if limit in PAGE_SIZES else 50
    before = take("before", lambda: cursor(params.get("before", ""), "before"), None)
    after = take("after", lambda: cursor(params.get("after", ""), "after"), None)
    return History(source, chosen, model, key_id, limit, before, after, deployment)
