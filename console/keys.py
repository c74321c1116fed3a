"""The keys: every group's in one list (search, status, last used, calls and credits in the period,
spend cap, expiry), one key (its usage per model, caps, allow-list), and revoking one, which asks
first (a page of its own: the form that revokes is only on it)."""

from __future__ import annotations

import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.store import KeyInfo, KeyMeta
from billing.usage_filter import Filter
from console import budget_forms, display, flash, lifecycle, operators, prefs, views
from console.app import Console, action, page
from console.filters import CallsQuery, Link, period_params
from console.forms import SOURCES, Invalid
from console.groups import key_fields, notice, period_of, quote_name, source_of
from core.inputs import natural
from core.money import to_credits

STATUSES = {"": "any", "live": "live", "revoked": "revoked"}
SORTS = {"used": "last used", "credits": "credits in the period", "calls": "calls in the period", "id": "id"}


async def key_or_404(c: Console, key_id: str) -> KeyInfo:
    number = natural(key_id)
    if number is not None:
        info = await c.store.get_key(number)
        if info is not None and operators.current().sees(info.group_name):
            return info
    raise HTTPException(404, f"No key with id {key_id}.")


def matches(k: KeyInfo, search: str) -> bool:
    search = search.lower()
    return any(search in str(v).lower() for v in (k.id, k.name, k.hint, k.group_name, k.owner, *k.tags))


@page
async def keys(c: Console, request: Request) -> Response:
    params = request.query_params
    errors: dict[str, str] = {}
    period = period_of(request, errors)
    search = params.get("q", "").strip()[:100]
    status = params.get("status", "") if params.get("status", "") in STATUSES else ""
    sort = params.get("sort", "used") if params.get("sort", "used") in SORTS else "used"
    everyone = [k for k in await c.store.list_keys() if operators.current().sees(k.group_name)]
    listed = [
        k
        for k in everyone
        if (not search or matches(k, search))
        and (not status or (status == "revoked") == (k.revoked_at is not None))
    ]
    zone = prefs.zone_of(request)
    since = period.since
    if since is None:
        since = await c.history.first_ts(Filter())
    per_key = await c.analysis.totals(Filter(since=since, until=period.until), ("key_id",))
    used = await c.analysis.last_used([k.id for k in listed])
    order = {
        "used": lambda k: -used.get(k.id, 0.0),
        "credits": lambda k: -per_key[(k.id,)].credits if (k.id,) in per_key else 0,
        "calls": lambda k: -per_key[(k.id,)].calls if (k.id,) in per_key else 0,
        "id": lambda k: k.id,
    }[sort]
    listed.sort(key=lambda k: (order(k), k.id))
    shown = listed[:500]
    amounts = [per_key[(k.id,)].credits for k in shown if (k.id,) in per_key]
    return c.render(
        request,
        "keys.html",
        keys=shown,
        more=len(listed) - len(shown),
        total=len(everyone),
        per_key=per_key,
        used=used,
        period=period,
        search=search,
        state=status,
        sort=sort,
        statuses=STATUSES,
        sorts=SORTS,
        errors=errors,
        zone=zone,
        places=display.places(amounts),
        spent_places=display.places(k.spent for k in shown),
        now=time.time(),
        link=Link(
            {"q": search, "status": status, "sort": sort if sort != "used" else None, **period_params(period)}
        ),
        kept=CallsQuery(period=period).kept(),
    )


async def key_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    errors: dict[str, str] = context.pop("errors", {})
    period = period_of(request, errors)  # (the default of every page: a link from one keeps its period)
    link = CallsQuery(source=source_of(request), period=period)
    f = Filter(
        info.group_id, key_id=info.id, since=period.since, until=period.until, source=SOURCES[link.source]
    )
    table = await views.breakdown(
        c,
        f,
        "model",
        "By model",
        lambda m: m or "(none)",
        lambda m: (
            f"{c.base(request)}/groups/{quote_name(info.group_name)}/calls?{link.query(key=info.id, model=m)}"
        ),
        top=100,
    )
    total = await c.analysis.total(f)
    used = await c.analysis.last_used([info.id])
    values = context.pop("values", None) or {
        "spend_cap": to_credits(info.spend_cap) if info.spend_cap is not None else "",
        "models": "\n".join(info.allowed_models or ()),
        "expires_at": display.iso(info.expires_at) if info.expires_at else "",
        "tags": ", ".join(info.tags),
        "owner": info.owner,
    }
    token = request.query_params.get("rotated", "")
    if token and not errors:
        context["new_secret"] = await flash.take(
            c.queries.db, await c.secret(), request.state.session.csrf, token
        )
    return c.render(
        request,
        "key.html",
        status=status,
        key=info,
        table=table,
        total=total,
        period=period,
        errors=errors,
        now=time.time(),
        values=values,
        notice=notice(request),
        last_used=used.get(info.id),
        link=link,
        places=display.places([info.spent, info.spend_cap or 0]),
        **await budget_forms.card(c, info.group_name, info.id),
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
    await c.changes(request, "console").update_key(info, cap, allowed)  # clears the cached principal
    return c.redirect(request, f"/keys/{info.id}", ok="updated")


@action
async def update_lifecycle(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    old = KeyMeta(info.expires_at, info.tags, info.owner)
    try:
        given = {
            "expires_at": form.get("expires_at", ""),
            "tags": form.get("tags", ""),
            "owner": form.get("owner", ""),
        }
        if info.expires_at and given["expires_at"].strip() == display.iso(info.expires_at):
            del given["expires_at"]  # unchanged (it may be past already: only a new expiry must be ahead)
        meta = lifecycle.meta_of(given, old)
    except Invalid as exc:
        return await key_page(c, request, 400, errors={exc.field: exc.message}, values=form)
    await c.changes(request, "console").update_key(
        info, info.spend_cap, list(info.allowed_models or ()) or None, meta
    )
    return c.redirect(request, f"/keys/{info.id}", ok="updated")


@page
async def confirm_rotate(c: Console, request: Request) -> Response:
    """What a rotation will do, before it is done: the grace period (``ROTATE_GRACE`` unless given)
    and when the current secret stops working."""
    info = await key_or_404(c, request.path_params["key_id"])
    given = request.query_params.get("grace", "").strip() or lifecycle.ROTATE_GRACE
    try:
        grace = lifecycle.grace(given, "grace")
    except Invalid as exc:
        return await key_page(c, request, 400, errors={exc.field: exc.message}, values={"grace": given})
    return c.render(
        request,
        "confirm_rotate.html",
        key=info,
        grace=given,
        seconds=grace,
        grace_text=lifecycle.grace_text(grace),
        until=time.time() + grace,
    )


@action
async def rotate(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    given = form.get("grace", "").strip() or lifecycle.ROTATE_GRACE
    if form.get("confirm") != "yes":  # only the confirmation page's form says so
        return c.redirect(request, f"/keys/{info.id}/rotate", grace=given)
    try:
        grace = lifecycle.grace(given, "grace")
    except Invalid as exc:
        return await key_page(c, request, 400, errors={exc.field: exc.message}, values=form)
    key, _ = await c.changes(request, "console").rotate_key(c.gateway.settings, info, grace)
    # the new secret goes to the next page through a one-time flash, as a new key's does
    token = await flash.put(c.queries.db, await c.secret(), request.state.session.csrf, key)
    return c.redirect(request, f"/keys/{info.id}", rotated=token)


@page
async def confirm_revoke(c: Console, request: Request) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    used = await c.analysis.last_used([info.id])
    return c.render(
        request,
        "confirm_revoke.html",
        key=info,
        last_used=used.get(info.id),
        back=c.safe(
            request, request.query_params.get("back", ""), f"/groups/{quote_name(info.group_name)}/keys"
        ),
    )


@action
async def revoke_key(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    if form.get("confirm") != "yes":  # only the confirmation page's form says so
        return c.redirect(request, f"/keys/{info.id}/revoke")
    await c.changes(request, "console").revoke_key(info.id)  # the next call with this key is refused at once
    return c.redirect(request, f"/groups/{quote_name(info.group_name)}/keys", ok="revoked")


async def _budget_owner(c: Console, request: Request) -> tuple[str, int | None, str]:
    info = await key_or_404(c, request.path_params["key_id"])
    return info.group_name, info.id, f"/keys/{info.id}"


def routes() -> list[Route]:
    return [
        Route("/keys", keys, methods=["GET"]),
        Route("/keys/{key_id}", key, methods=["GET"]),
        Route("/keys/{key_id}/update", update_key, methods=["POST"]),
        Route("/keys/{key_id}/lifecycle", update_lifecycle, methods=["POST"]),
        Route("/keys/{key_id}/rotate", confirm_rotate, methods=["GET"]),
        Route("/keys/{key_id}/rotate", rotate, methods=["POST"]),
        Route("/keys/{key_id}/revoke", confirm_revoke, methods=["GET"]),
        Route("/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
        *budget_forms.routes("/keys/{key_id}", _budget_owner, key_page),
    ]
