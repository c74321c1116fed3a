"""The batches of every group: the list (status, progress with its counts, cost so far), one batch (its
times, progress, cost and tokens so far, the problems that failed its validation, its failed lines,
a link to its calls), and cancelling one, which asks first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.analysis import Totals
from console import display, operators
from console.app import Console, action, page, refused
from console.groups import notice, quote_name
from gateway.state import BatchBook, BatchView

STATUSES = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
)
PER_PAGE = 25
FAILED_LINES = 50


@dataclass(slots=True)
class Line:
    line_no: int
    custom_id: str
    code: str
    message: str


def book(c: Console) -> BatchBook:
    if c.gateway.batches is None:
        raise HTTPException(404, "This gateway runs no batches.")
    return c.gateway.batches


@page
async def batches(c: Console, request: Request) -> Response:
    params = request.query_params
    status = params.get("status", "") if params.get("status", "") in STATUSES else ""
    groups = {g.id: g.name for g in await c.store.list_groups() if operators.current().sees(g.name)}
    group_name = params.get("group", "")
    group_id = next((i for i, n in groups.items() if n == group_name), None)
    if group_id is None and not operators.current().every_group:  # an operator of some groups: one of theirs
        if not groups:
            return refused(c, request, "Your role operates no group yet.")
        return c.redirect(request, "/batches", group=sorted(groups.values())[0])
    before = params.get("before", "")[:64] or None
    rows = list(await book(c).browse(group_id, status or None, before, PER_PAGE + 1))
    more = len(rows) > PER_PAGE
    rows = rows[:PER_PAGE]
    spent = await c.analysis.batches([b.id for b in rows])
    return c.render(
        request,
        "batches.html",
        batches=rows,
        spent=spent,
        groups=groups,
        state=status,
        statuses=STATUSES,
        group=group_name if group_id is not None else "",
        older=rows[-1].id if more else None,
        before=before,
        places=display.places(t.credits for t in spent.values()),
        notice=notice(request),
    )


async def batch_or_404(c: Console, batch_id: str) -> BatchView:
    """The batch, if the request's operator sees its group (404 otherwise, as for no batch)."""
    found = await book(c).batch(batch_id[:64])
    if found is not None and not operators.current().every_group:
        group = next((g.name for g in await c.store.list_groups() if g.id == found.group_id), None)
        found = found if operators.current().sees(group) else None
    if found is None:
        raise HTTPException(404, f"No batch {batch_id}.")
    return found


def failed_line(line_no: int, custom_id: str, result: str | None) -> Line:
    code, message = "", ""
    try:
        error = json.loads(result or "{}").get("error") or {}
        code, message = str(error.get("code") or ""), str(error.get("message") or "")
    except (ValueError, AttributeError):
        message = (result or "")[:500]
    return Line(line_no, custom_id, code, message)


@page
async def batch(c: Console, request: Request) -> Response:
    b = await batch_or_404(c, request.path_params["batch_id"])
    spent = (await c.analysis.batches([b.id])).get(b.id, Totals())
    lines = [
        failed_line(x.line_no, getattr(x, "custom_id", ""), x.result)
        for x in await book(c).failed_lines(b.id, FAILED_LINES)
    ]
    group = next((g.name for g in await c.store.list_groups() if g.id == b.group_id), "")
    return c.render(
        request,
        "batch.html",
        b=b,
        spent=spent,
        lines=lines,
        group=group,
        notice=notice(request),
        places=display.places([spent.credits]),
        group_q=quote_name(group),
    )


@page
async def confirm_cancel(c: Console, request: Request) -> Response:
    b = await batch_or_404(c, request.path_params["batch_id"])
    return c.render(request, "confirm_cancel.html", b=b)


@action
async def cancel(c: Console, request: Request, form: dict[str, str]) -> Response:
    b = await batch_or_404(c, request.path_params["batch_id"])
    if form.get("confirm") != "yes":
        return c.redirect(request, f"/batches/{b.id}/cancel")
    await book(c).cancel(b)
    return c.redirect(request, f"/batches/{b.id}", ok="cancelled")


def progress(b: Any) -> dict[str, Any]:
    done = b.completed + b.failed
    return {"done": done, "share": done / b.total if b.total else 0.0}


def routes() -> list[Route]:
    return [
        Route("/batches", batches, methods=["GET"]),
        Route("/batches/{batch_id}", batch, methods=["GET"]),
        Route("/batches/{batch_id}/cancel", confirm_cancel, methods=["GET"]),
        Route("/batches/{batch_id}/cancel", cancel, methods=["POST"]),
    ]
