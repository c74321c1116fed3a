"""The console's pages: login, groups, one group (keys, top-up), a group's usage analysis (history,
Jobs/API toggle, filters, chart, CSV), one key (usage per model, caps, allow-list, revoke).

Reads are GET pages that work without JavaScript; every change is a POST form with the CSRF token,
answered by a redirect (or, for a validation error, the same page with the error beside the field).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from billing.store import Group, KeyInfo, StoreError, UsageRecord
from console import auth, charts, forms
from console.app import Console, action, console_of, page, read_form, refused, same_origin, when
from console.forms import Invalid
from core.inputs import natural
from core.money import to_credits
from gateway.auth import new_key

NOTICES = {
    "created": "Group created.",
    "topped-up": "Credits added.",
    "updated": "Key updated.",
    "revoked": "Key revoked: calls with it are refused from now on.",
}


def client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def safe_next(request: Request, target: str) -> str:
    base = request.scope.get("root_path", "")
    if target.startswith(base + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return base + "/groups"


# -- login ----------------------------------------------------------------------------------------
async def login_form(request: Request) -> Response:
    c = console_of(request)
    await c.ensure()
    session = await c.session(request)
    if session is not None and session.admin:
        return c.redirect(request, "/groups")
    if session is None:
        session = auth.Session.anonymous(c.settings.session_seconds)
    request.state.session = session
    response = await login_page(c, request)
    await c.set_cookie(response, request, session)
    return response


def notice(request: Request) -> str:
    """The line that confirms what the last form did (``?ok=...`` after its redirect)."""
    return NOTICES.get(request.query_params.get("ok", ""), "")


async def login_page(c: Console, request: Request, error: str = "", status: int = 200) -> Response:
    target = request.query_params.get("next", "")
    configured = bool(auth.admin_token(c.settings) or await c.password_hash())
    return c.render(request, "login.html", status=status, error=error, next=target, configured=configured)


async def login(request: Request) -> Response:
    c = console_of(request)
    await c.ensure()
    session = await c.session(request)
    form = await _form(request)
    if form is None or session is None or not auth.csrf_ok(session, form.get("csrf")):
        fresh = auth.Session.anonymous(c.settings.session_seconds)
        request.state.session = fresh
        response = await login_page(c, request, "The login form expired: try again.", 403)
        await c.set_cookie(response, request, fresh)
        return response
    request.state.session = session
    # a browser that logged in before counts its failures on its own (console/auth.py, Throttling)
    device = await c.device(request)
    who, overall = (f"device:{device}", False) if device else (client_ip(request), True)
    wait = c.throttle.retry_after(who, overall)
    if wait is not None:
        response = await login_page(c, request, f"Too many failed logins: try again in {wait} seconds.", 429)
        response.headers["retry-after"] = str(wait)
        return response
    if not await c.check_login(form.get("password", "")):
        c.throttle.failed(who, overall)
        return await login_page(c, request, "Wrong password.", 401)
    c.throttle.succeeded(who)
    fresh = await c.log_in()
    response = RedirectResponse(safe_next(request, form.get("next", "")), status_code=303)
    await c.set_cookie(response, request, fresh)
    if device is None:
        await c.set_device_cookie(response, request)
    return response


async def _form(request: Request) -> dict[str, str] | None:
    return await read_form(request) if same_origin(request) else None


@action
async def logout(c: Console, request: Request, form: dict[str, str]) -> Response:
    await c.log_out(request.state.session)  # a replayed copy of the cookie opens nothing from now on
    response = c.redirect(request, "/login")
    await c.set_cookie(response, request, None)
    return response


# -- groups ---------------------------------------------------------------------------------------
@page
async def home(c: Console, request: Request) -> Response:
    return c.redirect(request, "/groups")


async def groups_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    groups = await c.store.list_groups()
    context.setdefault("errors", {})
    context.setdefault("values", {})
    return c.render(
        request,
        "groups.html",
        status=status,
        groups=groups,
        notice=notice(request),
        **context,
    )


groups = page(groups_page)


@action
async def create_group(c: Console, request: Request, form: dict[str, str]) -> Response:
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
            await c.store.create_group(name, amount)
        except StoreError as exc:
            errors["name"] = str(exc)
    if errors:
        return await groups_page(c, request, 400, errors=errors, values=form)
    return c.redirect(request, f"/groups/{name}", ok="created")


@action
async def topup(c: Console, request: Request, form: dict[str, str]) -> Response:
    name = request.path_params["name"]
    back = form.get("back", "group")
    try:
        amount = forms.credits(form.get("amount", ""), "amount", positive=True)
        assert amount is not None
        await c.store.topup(name, amount)
    except (Invalid, StoreError) as exc:
        message = exc.message if isinstance(exc, Invalid) else str(exc)
        if back == "list":
            return await groups_page(
                c, request, 400, topup_errors={name: message}, topup_values={name: form.get("amount", "")}
            )
        return await group_page(c, request, name, 400, errors={"amount": message}, values=form)
    if back == "list":
        return c.redirect(request, "/groups", ok="topped-up")
    return c.redirect(request, f"/groups/{quote_name(name)}", ok="topped-up")


def quote_name(name: str) -> str:
    return quote(name, safe="")


async def group_or_404(c: Console, name: str) -> Group:
    group = await c.store.get_group(name)
    if group is None:
        raise HTTPException(404, f"No group named {name!r}.")
    return group


async def group_page(c: Console, request: Request, name: str, status: int = 200, **context: Any) -> Response:
    group = await group_or_404(c, name)
    keys = await c.store.list_keys(group.name)
    context.setdefault("errors", {})
    context.setdefault("values", {})
    context.setdefault("new_key", None)
    return c.render(
        request,
        "group.html",
        status=status,
        group=group,
        keys=keys,
        models=c.model_ids(),
        notice=notice(request),
        **context,
    )


@page
async def group(c: Console, request: Request) -> Response:
    return await group_page(c, request, request.path_params["name"])


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
        return await group_page(c, request, group.name, 400, errors=errors, values=form)
    key, info = await new_key(c.store, c.gateway.settings, group.name, label, cap, allowed)
    return await group_page(c, request, group.name, new_key=(key, info))  # shown once, never stored


# -- keys -----------------------------------------------------------------------------------------
async def key_or_404(c: Console, key_id: str) -> KeyInfo:
    number = natural(key_id)
    if number is not None:
        info = await c.store.get_key(number)
        if info is not None:
            return info
    raise HTTPException(404, f"No key with id {key_id}.")


async def key_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    params = dict(request.query_params)
    errors: dict[str, str] = context.pop("errors", {})
    try:
        chosen = forms.period(params, default="30d")
    except Invalid as exc:
        errors[exc.field] = exc.message
        chosen = forms.period({}, default="30d")
    rows = await c.history.key_models(info.id, info.group_id, chosen.since, chosen.until)
    totals = {
        field: sum(getattr(r, field) for r in rows)
        for field in (
            "calls",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "reasoning_tokens",
            "credits",
            "errors",
        )
    }
    values = context.pop("values", None) or {
        "spend_cap": to_credits(info.spend_cap) if info.spend_cap is not None else "",
        "models": "\n".join(info.allowed_models or ()),
    }
    return c.render(
        request,
        "key.html",
        status=status,
        key=info,
        rows=rows,
        totals=totals,
        period=chosen,
        periods=forms.PERIODS,
        errors=errors,
        values=values,
        models=c.model_ids(),
        notice=notice(request),
        **context,
    )


key = page(key_page)


@action
async def update_key(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    errors: dict[str, str] = {}
    cap, allowed = key_fields(c, form, errors)
    if errors:
        return await key_page(c, request, 400, errors=errors, values=form)
    await c.store.update_key(info.id, cap, allowed)
    c.gateway.auth.forget()  # the cached principal still has the old caps
    return c.redirect(request, f"/keys/{info.id}", ok="updated")


@action
async def revoke_key(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    await c.store.revoke_key(info.id)
    c.gateway.auth.forget()  # the next call with this key is refused at once
    return c.redirect(request, f"/groups/{quote_name(info.group_name)}", ok="revoked")


# -- usage analysis -------------------------------------------------------------------------------
@page
async def usage(c: Console, request: Request) -> Response:
    group = await group_or_404(c, request.path_params["name"])
    errors: dict[str, str] = {}
    h = forms.history(dict(request.query_params), errors)
    f = h.filter(group.id)
    result = await c.history.history(f, h.limit, before=h.before, after=h.after)
    until = f.until if f.until is not None else time.time()
    since = f.since if f.since is not None else await c.history.first_ts(group.id)
    chart = ""
    if since is not None and until > since:
        width = charts.bucket_width(until - since)
        count = max(1, min(int((until - since) // width) + 1, charts.MAX_BUCKETS + 1))
        start = until - count * width
        buckets = await c.history.buckets(f, start, width, count)
        chart = charts.svg(buckets, width)
        totals = (sum(b.calls for b in buckets), sum(b.credits for b in buckets))
    else:
        totals = (0, 0)
    keys = {k.id: k for k in await c.store.list_keys(group.name)}
    by_deployment = await c.history.totals(f, "deployment")
    return c.render(
        request,
        "usage.html",
        status=400 if errors else 200,
        group=group,
        h=h,
        page=result,
        keys=keys,
        chart=chart,
        totals=totals,
        errors=errors,
        periods=forms.PERIODS,
        models=c.model_ids(),
        deployments=c.deployment_names(),
        by_deployment=by_deployment,
        page_sizes=forms.PAGE_SIZES,
    )


CSV_COLUMNS = [
    "id",
    "time_utc",
    "key_id",
    "key_name",
    "model",
    "provider",
    "deployment",
    "endpoint",
    "source",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "credits",
    "status",
    "usage_exact",
    "latency_ms",
    "ttft_ms",
    "request_id",
    "error",
]


def cell(value: Any) -> Any:
    """Text that a spreadsheet would run as a formula gets a leading quote."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_row(r: UsageRecord, keys: dict[int, KeyInfo]) -> list[Any]:
    name = keys[r.key_id].name if r.key_id in keys else ""
    return [
        cell(v)
        for v in (
            r.id,
            when(r.ts),
            r.key_id,
            name,
            r.model,
            r.provider,
            r.deployment,
            r.endpoint,
            r.source,
            int(r.stream),
            r.prompt_tokens,
            r.completion_tokens,
            r.cached_tokens,
            r.cache_write_tokens,
            r.reasoning_tokens,
            to_credits(r.credits),
            r.status,
            int(r.usage_exact),
            round(r.latency_ms, 1),
            "" if r.ttft_ms is None else round(r.ttft_ms, 1),
            r.request_id or "",
            r.error or "",
        )
    ]


@page
async def usage_csv(c: Console, request: Request) -> Response:
    group = await group_or_404(c, request.path_params["name"])
    errors: dict[str, str] = {}
    h = forms.history(dict(request.query_params), errors)
    if errors:
        return refused(c, request, " ".join(errors.values()), 400)
    keys = {k.id: k for k in await c.store.list_keys(group.name)}

    async def body() -> AsyncIterator[str]:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        async for rows in c.history.export(h.filter(group.id), c.settings.csv_max_rows):
            for r in rows:
                writer.writerow(csv_row(r, keys))
            yield out.getvalue()
            out.seek(0)
            out.truncate()
        if out.getvalue():
            yield out.getvalue()

    filename = f"usage-{group.name}-{h.source}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.csv"
    return StreamingResponse(
        body(),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{filename}"', "cache-control": "no-store"},
    )


def routes() -> list[Route]:
    return [
        Route("/", home, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/groups", groups, methods=["GET"]),
        Route("/groups", create_group, methods=["POST"]),
        Route("/groups/{name}", group, methods=["GET"]),
        Route("/groups/{name}/topup", topup, methods=["POST"]),
        Route("/groups/{name}/keys", create_key, methods=["POST"]),
        Route("/groups/{name}/usage", usage, methods=["GET"]),
        Route("/groups/{name}/usage.csv", usage_csv, methods=["GET"]),
        Route("/keys/{key_id}", key, methods=["GET"]),
        Route("/keys/{key_id}/update", update_key, methods=["POST"]),
        Route("/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
    ]
