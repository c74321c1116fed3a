"""Reading what the admin typed: credit amounts, names, model lists, page cursors.

Every parser returns a value or raises ``Invalid`` with a message meant for the form; nothing here
crashes on bad input. Amounts are credits with up to 9 decimals, turned into nano-credits exactly
(``core.money.to_nano``); thousands may be separated by commas, spaces or underscores ("1,000.5",
"1 000", "1_000"), but a comma is never a decimal point ("1,5" is refused, naming the reason).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar, get_args
from urllib.parse import parse_qs

from billing import budgets
from core.inputs import group_name_problem, natural
from core.money import to_nano
from core.types import Source

T = TypeVar("T")

MAX_FORM_BYTES = 64 * 1024
AMOUNT = re.compile(r"^\d{1,12}(\.\d{1,9})?$")
# 1,000,000.5 · 1 000 000 · 1_000_000
GROUPED = re.compile(r"^\d{1,3}([,\s\u00a0\u202f_]\d{3})+(\.\d{1,9})?$")
MODEL = re.compile(r"^[a-z0-9][a-z0-9._:/-]{0,127}$")
# ``?source=`` everywhere in the console: every core.types.Source, or all of them
SOURCES: dict[str, Source | None] = {"all": None, **{s: s for s in get_args(Source)}}
PAGE_SIZES = (25, 50, 100, 200, 500)


class Invalid(ValueError):
    """Bad input, with the message to show next to the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def credits(text: str, field: str, *, positive: bool = False, allow_empty: bool = False) -> int | None:
    text = text.strip()
    if not text:
        if allow_empty:
            return None
        raise Invalid(field, "Enter an amount of credits.")
    if GROUPED.match(text):
        text = re.sub(r"[,\s\u00a0\u202f_]", "", text)
    elif "," in text:
        raise Invalid(
            field, f"“{text[:40]}”: use a point for decimals (1.5) and commas only between thousands (1,000)."
        )
    if not AMOUNT.match(text):
        raise Invalid(field, f"“{text[:40]}” is not an amount of credits: use digits, with up to 9 decimals.")
    try:
        nano = to_nano(text)
    except ValueError:
        raise Invalid(
            field, f"“{text[:40]}” is not an amount of credits: use digits, with up to 9 decimals."
        ) from None
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


def form_data(body: bytes) -> dict[str, str]:
    """An urlencoded body as a dict of first values (a field sent twice keeps its first value)."""
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in parsed.items()}


def cursor(text: str, field: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    value = natural(text)
    if value is None:
        raise Invalid(field, "Not a page cursor.")
    return value


def budget_window(
    window: Any, tz: Any, default_tz: str, fields: tuple[str, str] = ("window", "timezone")
) -> tuple[str, str]:
    """A budget's window and time zone as an operator gives them (the console's form, the admin API):
    ``day``/``week``/``month`` (calendar, in ``tz``) or a rolling ``30m``/``12h``/``7d``."""
    zone = tz if isinstance(tz, str) and tz.strip() else default_tz
    try:
        budgets.check_zone(zone)
    except budgets.BudgetError as exc:
        raise Invalid(fields[1], str(exc)) from None
    try:
        budgets.parse_period(window, str(zone))
    except budgets.BudgetError as exc:
        raise Invalid(fields[0], str(exc)) from None
    return str(window).strip(), str(zone)
