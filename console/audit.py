"""The audit log's page: every change an operator made (console, admin API, CLI), newest first, with
who, when, what, and the object before and after; filtered by target (``key:12``, ``group:acme``) or
action (``key.rotate``), paged by id."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from console import forms
from console.app import Console, page
from console.forms import Invalid

PAGE = 100


def changed(before: object, after: object) -> list[tuple[str, str, str]]:
    """The fields that differ between two snapshots (name, before, after), for the table."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    rows = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            rows.append((name, _text(old.get(name)), _text(new.get(name))))
    return rows


def _text(value: object) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


@page
async def audit(c: Console, request: Request) -> Response:
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
    rows = [(e, changed(e.before, e.after)) for e in entries]
    older = entries[-1].id if len(entries) == PAGE else None
    return c.render(request, "audit.html", rows=rows, target=target or "", action=action or "", older=older,
                    errors=errors)  # fmt: skip


def routes() -> list[Route]:
    return [Route("/audit", audit, methods=["GET"])]
