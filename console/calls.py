"""The calls: a group's call history (the Jobs/API toggle, every filter, the period's chart, pages with
their numbers, the CSV of what is shown), one call with every field of its record, and finding a call
the calls of every group with the same filters, and finding a call by our request id or the provider's.

The history is read newest first, one page at a time, with keyset pagination on the usage id (a page
costs the same at the millionth record as at the first); the oldest page is one query too
(``after=0``). The CSV has every column, the exact credits and ISO 8601 times in UTC.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from billing.store import Group, KeyInfo, UsageRecord
from billing.usage_filter import Filter
from console import charge, display, filters, operators, prefs, views
from console.app import Console, every_group, page, refused
from console.filters import CallsQuery
from console.groups import group_or_404, quote_name
from core.inputs import natural

CSV_COLUMNS = [
    "id",
    "time",
    "group_id",
    "key_id",
    "key_name",
    "model",
    "provider",
    "deployment",
    "endpoint",
    "source",
    "batch_id",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "credits",
    "status",
    "error_code",
    "usage_exact",
    "latency_ms",
    "ttft_ms",
    "request_id",
    "upstream_request_id",
    "end_user",
    "error",
]


async def query_of(
    c: Console, request: Request, group_id: int | None, errors: dict[str, str]
) -> tuple[CallsQuery, Filter, list[str]]:
    """The page's query, its filter (the model filter resolved), and the models the group (or any
    group) called."""
    q = filters.parse(dict(request.query_params), prefs.zone_of(request), time.time(), errors)
    used = await c.analysis.models_used(group_id)
    models = None
    if q.model:
        models = filters.resolve_models(q.model, c.gateway.catalog, used)
        if not models:
            errors["model"] = (
                f"No model matches “{q.model}”: pick one of the models {'this group' if group_id else 'any group'} called."
            )
    return q, q.filter(group_id, models), used


async def history(c: Console, request: Request, group: Group | None) -> Response:
    """The calls of one group, or of every group (``group`` None): the same filters, chart and pages."""
    errors: dict[str, str] = {}
    q, f, used = await query_of(c, request, group.id if group else None, errors)
    zone = prefs.zone_of(request)
    whose = group.name if group else "every group"
    shown = await views.summary(
        c, f, q.period, zone, f"Credits and calls of {whose}, {q.period.label}", latency=False
    )
    f = replace(f, since=shown.since)
    result, pager = await views.page_of(c, f, q.limit, q.page, q.before, q.after)
    keys = {k.id: k for k in await c.store.list_keys(group.name if group else None)}
    here = f"{c.base(request)}/groups/{quote_name(group.name)}/calls" if group else f"{c.base(request)}/calls"
    by_deployment = await views.breakdown(
        c,
        f,
        "deployment",
        "By deployment",
        lambda d: d or "(none)",
        lambda d: f"{here}?{q.query(deployment=d or None)}",
    )
    groups = {} if group else {g.id: g.name for g in await c.store.list_groups()}
    return c.render(
        request,
        "calls.html",
        by_deployment=by_deployment,
        deployments=c.deployment_names(),
        status=400 if errors else 200,
        group=group,
        q=q,
        f=f,
        page=result,
        pager=pager,
        keys=keys,
        shown=shown,
        errors=errors,
        models=used,
        tab="calls",
        page_sizes=filters.PAGE_SIZES,
        statuses=filters.STATUSES,
        providers=sorted(c.gateway.catalog.providers),
        zone=zone,
        groups=groups,
        places=display.places(r.credits for r in result.rows),
        here=here,
    )


@page
async def calls(c: Console, request: Request) -> Response:
    return await history(c, request, await group_or_404(c, request.path_params["name"]))


@page
async def every_call(c: Console, request: Request) -> Response:
    """``/calls``: the calls of every group; ``/calls?request=<id>`` alone: that call, found by our
    request id or the provider's."""
    if set(request.query_params) == {"request"}:
        return await find(c, request)
    return every_group(c, request) or await history(c, request, None)


def cell(value: Any) -> Any:
    """Text that a spreadsheet would run as a formula gets a leading quote."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_row(r: UsageRecord, keys: dict[int, KeyInfo]) -> list[Any]:
    name = keys[r.key_id].name if r.key_id in keys else ""
    values = (
        r.id,
        display.iso(r.ts),
        r.group_id,
        r.key_id,
        name,
        r.model,
        r.provider,
        r.deployment,
        r.endpoint,
        r.source,
        r.batch_id or "",
        int(r.stream),
        r.prompt_tokens,
        r.completion_tokens,
        r.cached_tokens,
        r.cache_write_tokens,
        r.reasoning_tokens,
        display.exact(r.credits),
        r.status,
        r.error_code or "",
        int(r.usage_exact),
        round(r.latency_ms, 1),
        "" if r.ttft_ms is None else round(r.ttft_ms, 1),
        r.request_id or "",
        r.upstream_request_id or "",
        r.end_user or "",
        r.error or "",
    )
    return [cell(v) for v in values]


async def export(c: Console, request: Request, group: Group | None) -> Response:
    errors: dict[str, str] = {}
    q, f, _ = await query_of(c, request, group.id if group else None, errors)
    if errors:
        return refused(c, request, " ".join(errors.values()), 400)
    keys = {k.id: k for k in await c.store.list_keys(group.name if group else None)}

    async def body() -> AsyncIterator[str]:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        async for rows in c.history.export(f, c.settings.csv_max_rows):
            for r in rows:
                writer.writerow(csv_row(r, keys))
            yield out.getvalue()
            out.seek(0)
            out.truncate()
        if out.getvalue():
            yield out.getvalue()

    filename = f"usage-{group.name if group else 'all'}-{q.source}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.csv"
    return StreamingResponse(
        body(),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{filename}"', "cache-control": "no-store"},
    )


@page
async def calls_csv(c: Console, request: Request) -> Response:
    return await export(c, request, await group_or_404(c, request.path_params["name"]))


@page
async def every_call_csv(c: Console, request: Request) -> Response:
    return every_group(c, request) or await export(c, request, None)


@page
async def call(c: Console, request: Request) -> Response:
    number = natural(request.path_params["call_id"])
    record = await c.history.record(number) if number is not None else None
    key = await c.store.get_key(record.key_id) if record is not None else None
    group = key.group_name if key else None
    if record is None or not operators.current().sees(group):
        raise HTTPException(404, f"No call with id {request.path_params['call_id']}.")
    others: list[
        UsageRecord
    ] = []  # the same request's other records: the candidates it fell back from (or to)
    if record.request_id:
        found = await c.history.history(
            Filter(group_id=record.group_id, request_id=record.request_id), limit=20
        )
        others = [r for r in reversed(found.rows) if r.id != record.id]
    return c.render(
        request,
        "call.html",
        r=record,
        key=key,
        group=group,
        places=display.places([record.credits]),
        charge=charge.explain(c.gateway.catalog, record),
        attempts=attempts_of(record),
        others=others,
    )


def attempts_of(record: UsageRecord) -> list[tuple[str, str, float]]:
    """The deployments a call tried, in order (kept when there was more than one attempt)."""
    try:
        return [(str(d), str(outcome), float(ms)) for d, outcome, ms in json.loads(record.attempts or "[]")]
    except (ValueError, TypeError):
        return []


UPSTREAM_SEARCH_DAYS = 30  # the provider's request id has no index: its search keeps to the last 30 days


async def find(c: Console, request: Request) -> Response:
    """The call with this request id, ours (indexed, every day) or else the provider's (the last
    ``UPSTREAM_SEARCH_DAYS``): its page if there is one call, the list if several."""
    wanted = request.query_params.get("request", "").strip()[:256]
    found: list[UsageRecord] = []
    by = "ours"
    if wanted:
        found = (await c.history.history(Filter(request_id=wanted), 20)).rows
        if not found:
            since = time.time() - UPSTREAM_SEARCH_DAYS * 86400
            found = (await c.history.history(Filter(upstream_request_id=wanted, since=since), 20)).rows
            by = "the provider's"
    groups = {g.id: g.name for g in await c.store.list_groups()}
    found = [r for r in found if operators.current().sees(groups.get(r.group_id))]
    if len(found) == 1:
        return c.redirect(request, f"/calls/{found[0].id}")
    return c.render(
        request,
        "find.html",
        wanted=wanted,
        found=found,
        groups=groups,
        by=by,
        days=UPSTREAM_SEARCH_DAYS,
        places=display.places(r.credits for r in found),
    )


def routes() -> list[Route]:
    return [
        Route("/groups/{name}/calls", calls, methods=["GET"]),
        Route("/groups/{name}/calls.csv", calls_csv, methods=["GET"]),
        Route("/groups/{name}/usage", calls, methods=["GET"]),  # (the page's earlier address)
        Route("/groups/{name}/usage.csv", calls_csv, methods=["GET"]),
        Route("/calls", every_call, methods=["GET"]),
        Route("/calls.csv", every_call_csv, methods=["GET"]),
        Route("/calls/{call_id}", call, methods=["GET"]),
    ]
