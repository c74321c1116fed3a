"""The overview (``/console/``): spend and calls over time across every group, the error rate, latency
and time-to-first-token percentiles, and the groups, models and keys that spent most, for a period
(and the Jobs/API toggle)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.usage_filter import Filter
from console import filters, forms, operators, prefs, views
from console.app import Console, page
from console.groups import notice, period_of, quote_name, source_of


@page
async def overview(c: Console, request: Request) -> Response:
    if not operators.current().every_group:  # an operator of some groups: their list is the start
        return c.redirect(request, "/groups")
    errors: dict[str, str] = {}
    period = period_of(request, errors)
    source = source_of(request)
    zone = prefs.zone_of(request)
    f = Filter(source=forms.SOURCES[source], until=period.until)
    shown = await views.summary(c, f, period, zone, f"Credits and calls of every group, {period.label}")
    f = Filter(source=forms.SOURCES[source], since=shown.since, until=period.until)
    groups = {g.id: g.name for g in await c.store.list_groups()}
    keys = {k.id: k for k in await c.store.list_keys()}
    base = c.base(request)
    link = filters.CallsQuery(source=source, period=period)  # (every link keeps the toggle and the period)
    tables = [
        await views.breakdown(
            c,
            f,
            "group_id",
            "Top groups",
            lambda g: groups.get(g, f"group {g}"),
            lambda g: f"{base}/groups/{quote_name(groups.get(g, ''))}?{link.query()}",
            more_link=f"{base}/groups",
        ),
        await views.breakdown(
            c,
            f,
            "model",
            "Top models",
            lambda m: m or "(none)",
            lambda m: f"{base}/calls?{link.query(model=m)}" if m else "",
            more_link=f"{base}/calls?{link.query()}",
        ),
        await views.breakdown(
            c,
            f,
            "key_id",
            "Top keys",
            lambda k: f"{k} · {keys[k].name or keys[k].hint} ({keys[k].group_name})" if k in keys else str(k),
            lambda k: f"{base}/keys/{k}?{link.query()}",
            more_link=f"{base}/keys?{link.query(source=None)}&sort=credits",
        ),
    ]
    return c.render(
        request,
        "overview.html",
        period=period,
        source=source,
        shown=shown,
        tables=tables,
        errors=errors,
        notice=notice(request),
        link=link,
    )


def routes() -> list[Route]:
    return [Route("/", overview, methods=["GET"])]
