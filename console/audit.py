"""The audit log's page: every change an operator made (console, admin API, CLI), newest first, with
who, when, what, and the object before and after; filtered by target (``key:12``, ``group:acme``) or
action (``key.rotate``), paged by id."""

from __future__ import annotations

import json
from zoneinfo import ZoneInfo

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from console import display, forms, prefs
from console.app import Console, every_group, page
from console.forms import Invalid

PAGE = 100


# the snapshots' fields that hold nano-credits (groups, keys, webhooks) and those that hold instants
CREDITS = frozenset(
    {"balance", "reserved", "spent", "spend_cap", "balance_below_nano", "amount_nano", "added"}
)
INSTANTS = frozenset(
    {"created_at", "revoked_at", "expires_at", "last_used_at", "rotated_until", "deleted_at"}
)


def changed(before: object, after: object, zone: ZoneInfo = display.UTC) -> list[tuple[str, str, str]]:
    """The fields that differ between two snapshots (name, before, after), for the table: amounts
    in credits and instants in the operator's zone, as the rest of the console shows them."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    rows = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            rows.append((name, _text(name, old.get(name), zone), _text(name, new.get(name), zone)))
    return rows


def _text(name: str, value: object, zone: ZoneInfo) -> str:
    if value is None:
        return ""
    if name in CREDITS and isinstance(value, int) and not isinstance(value, bool):
        return f"{display.fixed(value, display.places(value))} credits"
    if name in INSTANTS and isinstance(value, int | float) and not isinstance(value, bool):
        return display.when(float(value), zone)
    return value if isinstance(value, str) else json.dumps(value)


@page
async def audit(c: Console, request: Request) -> Response:
    if (refusal := every_group(c, request)) is not None:
        return refusal
    p = request.query_params
    target = p.get("target", "").strip()[:100] or None
    action = p.get("action", "").strip()[:100] or None
    errors: dict[str, str] = {}
    try:
        before = forms.cursor(p.get("before", ""), "before")
    except Invalid as exc:
        errors[exc.field] = exc.message
        before = None
    entries = await c.audit.entries(PAGE, before, target, action)
    zone = prefs.zone_of(request)
    rows = [(e, changed(e.before, e.after, zone)) for e in entries]
    older = entries[-1].id if len(entries) == PAGE else None
    return c.render(
        request, "audit.html", rows=rows, target=target or "", action=action or "", older=older, errors=errors
    )


def routes() -> list[Route]:
    return [Route("/audit", audit, methods=["GET"])]
