"""The keys: every group's in one list (search, status, last used, calls and credits in the period,
spend cap, expiry), one key (its usage per model, caps, allow-list), and revoking one, which asks
first (a page of its own: the form that revokes is only on it)."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.store import KeyInfo
from billing.usage_filter import Filter
from console import display, prefs, views
from console.app import Console, action, page
from console.filters import CallsQuery, Link, period_params
from console.groups import key_fields, notice, period_of, quote_name
from core.inputs import natural
from core.money import to_credits

STATUSES = {"": "any", "live": "live", "revoked": "revoked"}
SORTS = {"used": "last used", "credits": "credits in the period", "calls": "calls in the period", "id": "id"}


async def key_or_404(c: Console, key_id: str) -> KeyInfo:
    number = natural(key_id)
    if number is not None:
        info = await c.store.get_key(number)
        if info is not None:
            return info
    raise HTTPException(404, f"No key with id {key_id}.")


def matches(k: KeyInfo, search: str) -> bool:
    search = search.lower()
    return any(search in str(v).lower() for v in (k.id, k.name, k.hint, k.group_name))


@page
async def keys(c: Console, request: Request) -> Response:
    params = request.query_params
    errors: dict[str, str] = {}
    period = period_of(request, errors)
    search = params.get("q", "").strip()[:100]
    status = params.get("status", "") if params.get("status", "") in STATUSES else ""
    sort = params.get("sort", "used") if params.get("sort", "used") in SORTS else "used"
    everyone = await c.store.list_keys()
    listed = [k for k in everyone if (not search or matches(k, search))
              and (not status or (status == "revoked") == (k.revoked_at is not None))]  # fmt: skip
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
        request, "keys.html", keys=shown, more=len(listed) - len(shown), total=len(everyone), per_key=per_key,
        used=used, period=period, search=search, state=status, sort=sort, statuses=STATUSES, sorts=SORTS,
        errors=errors, zone=zone, places=display.places(amounts), spent_places=display.places(k.spent for k in shown),
        link=Link({"q": search, "status": status, "sort": sort if sort != "used" else None, **period_params(period)}),
    )  # fmt: skip


async def key_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    errors: dict[str, str] = context.pop("errors", {})
    period = period_of(request, errors, "30d")
    f = Filter(info.group_id, key_id=info.id, since=period.since, until=period.until)
    table = await views.breakdown(c, f, "model", "By model", lambda m: m or "(none)",
                                  lambda m: f"{c.base(request)}/groups/{quote_name(info.group_name)}/calls?key={info.id}&model={m}",
                                  top=100)  # fmt: skip
    total = await c.analysis.total(f)
    used = await c.analysis.last_used([info.id])
    values = context.pop("values", None) or {
        "spend_cap": to_credits(info.spend_cap) if info.spend_cap is not None else "",
        "models": "\n".join(info.allowed_models or ()),
    }
    return c.render(
        request, "key.html", status=status, key=info, table=table, total=total, period=period, errors=errors,
        values=values, notice=notice(request), last_used=used.get(info.id), link=CallsQuery(period=period),
        places=display.places([info.spent, info.spend_cap or 0]), **context,
    )  # fmt: skip


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


@page
async def confirm_revoke(c: Console, request: Request) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    used = await c.analysis.last_used([info.id])
    return c.render(request, "confirm_revoke.html", key=info, last_used=used.get(info.id),
                    back=c.safe(request, request.query_params.get("back", ""), f"/groups/{quote_name(info.group_name)}/keys"))  # fmt: skip


@action
async def revoke_key(c: Console, request: Request, form: dict[str, str]) -> Response:
    info = await key_or_404(c, request.path_params["key_id"])
    if form.get("confirm") != "yes":  # only the confirmation page's form says so
        return c.redirect(request, f"/keys/{info.id}/revoke")
    await c.store.revoke_key(info.id)
    c.gateway.auth.forget()  # the next call with this key is refused at once
    return c.redirect(request, f"/groups/{quote_name(info.group_name)}/keys", ok="revoked")


def routes() -> list[Route]:
    return [
        Route("/keys", keys, methods=["GET"]),
        Route("/keys/{key_id}", key, methods=["GET"]),
        Route("/keys/{key_id}/update", update_key, methods=["POST"]),
        Route("/keys/{key_id}/revoke", confirm_revoke, methods=["GET"]),
        Route("/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
    ]
