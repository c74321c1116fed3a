"""The groups: the list (balances, top-up), a group's summary (its period's chart, figures and
breakdown by model, key, endpoint and source) and its keys (create one: the clear key is shown once,
after the redirect, from a one-time flash; revoke, after a confirmation)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.store import Group, StoreError
from billing.usage_filter import Filter
from console import budget_forms, filters, flash, forms, operators, periods, prefs, views
from console.app import Console, action, may_change, page
from console.forms import Invalid

NOTICES = {
    "created": "Group created.",
    "topped-up": "Credits added.",
    "updated": "Key updated.",
    "revoked": "Key revoked: calls with it are refused from now on.",
    "cancelled": "The batch is being cancelled: lines not yet started will not run.",
    "budget-added": "Budget added: calls are refused once a window's spend would pass it.",
    "budget-updated": "Budget changed.",
    "budget-removed": "Budget removed.",
}


TOPUPS = 10  # the latest top-ups a group's page lists (the audit log has them all)


def notice(request: Request) -> str:
    """The line that confirms what the last form did (``?ok=...`` after its redirect)."""
    return NOTICES.get(request.query_params.get("ok", ""), "")


def quote_name(name: str) -> str:
    return quote(name, safe="")


async def group_or_404(c: Console, name: str) -> Group:
    """The group, if the request's operator sees it (404 otherwise, as for no group)."""
    group = await c.store.get_group(name)
    if group is None or not operators.current().sees(group.name):
        raise HTTPException(404, f"No group named {name!r}.")
    return group


def period_of(request: Request, errors: dict[str, str], default: str = "7d") -> periods.Period:
    zone = prefs.zone_of(request)
    try:
        return periods.choose(dict(request.query_params), zone, time.time(), default)
    except Invalid as exc:
        errors[exc.field] = exc.message
        return periods.choose({}, zone, time.time(), default)


def source_of(request: Request) -> str:
    source = request.query_params.get("source", "all")
    return source if source in forms.SOURCES else "all"


# -- the list -------------------------------------------------------------------------------------
async def groups_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    groups = [g for g in await c.store.list_groups() if operators.current().sees(g.name)]
    context.setdefault("errors", {})
    context.setdefault("values", {})
    columns = [g.balance for g in groups] + [g.reserved for g in groups] + [g.spent for g in groups]
    return c.render(
        request,
        "groups.html",
        status=status,
        groups=groups,
        notice=notice(request),
        places=views.display.places(columns),
        **context,
    )


groups = page(groups_page)


@action
async def create_group(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    errors: dict[str, str] = {}
    name = amount = None
    try:
        name = forms.group_name(form.get("name", ""), "name")
    except Invalid as exc:
        errors[exc.field] = exc.message
    try:
        amount = forms.credits(form.get("credits", "") or "0", "credits")
    except Invalid as exc:
        errors[exc.field] = exc.message
    if not errors and name is not None and amount is not None:
        try:
            await c.changes(request, "console").create_group(name, amount)
        except StoreError as exc:
            errors["name"] = str(exc)
    if errors:
        return await groups_page(c, request, 400, errors=errors, values=form)
    return c.redirect(request, f"/groups/{quote_name(name or '')}", ok="created")


@action
async def topup(c: Console, request: Request, form: dict[str, str]) -> Response:
    name = (await group_or_404(c, request.path_params["name"])).name
    back = form.get("back", "group")
    try:
        amount = forms.credits(form.get("amount", ""), "amount", positive=True)
        assert amount is not None
        await c.changes(request, "console").topup(name, amount)
    except (Invalid, StoreError) as exc:
        message = exc.message if isinstance(exc, Invalid) else str(exc)
        if back == "list":
            return await groups_page(
                c, request, 400, topup_errors={name: message}, topup_values={name: form.get("amount", "")}
            )
        return await summary_page(c, request, name, 400, errors={"amount": message}, values=form)
    if back == "list":
        return c.redirect(request, "/groups", ok="topped-up")
    return c.redirect(request, f"/groups/{quote_name(name)}", ok="topped-up")


# -- one group ------------------------------------------------------------------------------------
async def summary_page(
    c: Console, request: Request, name: str, status: int = 200, **context: Any
) -> Response:
    group = await group_or_404(c, name)
    errors: dict[str, str] = context.pop("errors", {})
    period = period_of(request, errors)
    source = source_of(request)
    zone = prefs.zone_of(request)
    f = Filter(group.id, source=forms.SOURCES[source], until=period.until)
    shown = await views.summary(c, f, period, zone, f"Credits and calls of {group.name}, {period.label}")
    f = Filter(group.id, source=forms.SOURCES[source], since=shown.since, until=period.until)
    keys = {k.id: k for k in await c.store.list_keys(group.name)}
    here = f"{c.base(request)}/groups/{quote_name(group.name)}/calls"
    calls = filters.CallsQuery(source=source, period=period)
    tables = [
        await views.breakdown(
            c, f, "model", "By model", lambda m: m or "(none)", lambda m: f"{here}?{calls.query(model=m)}"
        ),
        await views.breakdown(
            c,
            f,
            "key_id",
            "By key",
            lambda k: _key_label(keys, k),
            lambda k: f"{c.base(request)}/keys/{k}?{calls.kept()}",
        ),
        await views.breakdown(
            c, f, "endpoint", "By endpoint", str, lambda e: f"{here}?{calls.query(endpoint=e)}"
        ),
        await views.breakdown(
            c,
            f,
            "source",
            "By source",
            lambda s: "Jobs" if s == "job" else "API",
            lambda s: f"{here}?{calls.query(source=s)}",
        ),
    ]
    deployments = await views.breakdown(
        c,
        f,
        "deployment",
        "By deployment",
        lambda d: d or "(none)",
        lambda d: f"{here}?{calls.query(deployment=d or None)}",
    )
    if any(r.key for r in deployments.rows):  # a provider with several deployments served some
        tables.append(deployments)
    context.setdefault("values", {})
    return c.render(
        request,
        "group.html",
        status=status,
        group=group,
        period=period,
        source=source,
        shown=shown,
        tables=tables,
        errors=errors,
        notice=notice(request),
        tab="summary",
        link=calls,
        budget_keys=list(keys.values()),
        **await budget_forms.card(c, group.name),
        topups=await c.audit.entries(TOPUPS, None, f"group:{group.name}", "group.topup"),
        places=views.display.places([group.balance, group.reserved, group.spent]),
        **context,
    )


def _key_label(keys: dict[int, Any], key_id: int) -> str:
    k = keys.get(key_id)
    return f"{key_id} · {k.name or k.hint}" if k else str(key_id)


@page
async def summary(c: Console, request: Request) -> Response:
    return await summary_page(c, request, request.path_params["name"])


async def keys_page(c: Console, request: Request, name: str, status: int = 200, **context: Any) -> Response:
    group = await group_or_404(c, name)
    keys = await c.store.list_keys(group.name)
    used = await c.analysis.last_used([k.id for k in keys])
    new = None
    token = request.query_params.get("created", "")
    if token and not context.get("errors"):
        session = request.state.session
        clear = await flash.take(c.queries.db, await c.secret(), session.csrf, token)
        if clear is not None:
            new = (clear, next((k for k in keys if str(k.id) == request.query_params.get("key")), None))
    context.setdefault("errors", {})
    context.setdefault("values", {})
    return c.render(
        request,
        "group_keys.html",
        status=status,
        group=group,
        keys=keys,
        used=used,
        new_key=new,
        link=filters.CallsQuery(source=source_of(request), period=period_of(request, {})),
        tab="keys",
        notice=notice(request),
        places=views.display.places([k.spent for k in keys] + [k.spend_cap for k in keys]),
        **context,
    )


@page
async def group_keys(c: Console, request: Request) -> Response:
    return await keys_page(c, request, request.path_params["name"])


def key_fields(
    c: Console, form: dict[str, str], errors: dict[str, str]
) -> tuple[int | None, list[str] | None]:
    cap: int | None = None
    allowed: list[str] | None = None
    try:
        cap = forms.credits(form.get("spend_cap", ""), "spend_cap", allow_empty=True)
    except Invalid as exc:
        errors[exc.field] = exc.message
    try:
        allowed = forms.models(form.get("models", ""), "models", set(c.gateway.catalog.models))
    except Invalid as exc:
        errors[exc.field] = exc.message
    return cap, allowed


@action
async def create_key(c: Console, request: Request, form: dict[str, str]) -> Response:
    group = await group_or_404(c, request.path_params["name"])
    errors: dict[str, str] = {}
    label = ""
    try:
        label = forms.label(form.get("label", ""), "label")
    except Invalid as exc:
        errors[exc.field] = exc.message
    cap, allowed = key_fields(c, form, errors)
    if errors:
        return await keys_page(c, request, group.name, 400, errors=errors, values=form)
    key, info = await c.changes(request, "console").create_key(
        c.gateway.settings, group.name, label, cap, allowed
    )
    # the clear key goes to the next page through a one-time flash: a reload shows (and makes) nothing
    token = await flash.put(c.queries.db, await c.secret(), request.state.session.csrf, key)
    return c.redirect(request, f"/groups/{quote_name(group.name)}/keys", created=token, key=info.id)


async def _budget_owner(c: Console, request: Request) -> tuple[str, int | None, str]:
    group = await group_or_404(c, request.path_params["name"])
    return group.name, None, f"/groups/{quote_name(group.name)}"


async def _summary_again(c: Console, request: Request, status: int, **context: Any) -> Response:
    return await summary_page(c, request, request.path_params["name"], status, **context)


def routes() -> list[Route]:
    return [
        Route("/groups", groups, methods=["GET"]),
        Route("/groups", create_group, methods=["POST"]),
        Route("/groups/{name}", summary, methods=["GET"]),
        Route("/groups/{name}/topup", topup, methods=["POST"]),
        Route("/groups/{name}/keys", group_keys, methods=["GET"]),
        Route("/groups/{name}/keys", create_key, methods=["POST"]),
        *budget_forms.routes("/groups/{name}", _budget_owner, _summary_again),
    ]
