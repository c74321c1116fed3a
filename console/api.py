"""The admin JSON API, for automation: the console's operations over HTTP, under ``/console/api``.

Every call needs ``Authorization: Bearer <admin token>`` (``[console] admin_token`` or
``$ROUTER_CONSOLE_TOKEN``); with no token configured the API is off (403). Bad tokens count as failed
logins (429 past the limit). Amounts are credits as decimal strings (``"12.5"``; numbers accepted on
input), with the exact integer of nano-credits beside them (``balance_nano``). Errors are
``{"error": {"message", "type", "code"}}``.

    GET    /api/groups                          groups
    POST   /api/groups                          {"name", "credits"}
    GET    /api/groups/{name}
    POST   /api/groups/{name}/topup             {"credits"}
    GET    /api/groups/{name}/keys
    POST   /api/groups/{name}/keys              {"name", "spend_cap"?, "allowed_models"?, "expires_at"?,
                                                 "tags"?, "owner"?} -> the key, once
    GET    /api/groups/{name}/usage             ?source=api|job&model=&key=&since=&until=&before=&limit=
    GET    /api/groups/{name}/usage/buckets     ?width=3600&since=&until=&source=&model=&key=
    GET    /api/keys/{id}
    PATCH  /api/keys/{id}                       {"spend_cap": "10" | null, "allowed_models": [...] | null,
                                                 "expires_at": ... | null, "tags": [...], "owner": "..."}
    POST   /api/keys/{id}/rotate                {"grace_seconds": 3600} -> the new secret, once
    POST   /api/keys/{id}/revoke
    GET    /api/keys/{id}/usage                 ?since=&until=  (one row per model)
    GET    /api/webhooks                        webhooks (never their secrets)
    POST   /api/webhooks                        {"url", "group"?, "balance_below"?, "expiry_within"?, "budgets"?}
                                                 -> the webhook and its signing secret, once
    DELETE /api/webhooks/{id}
    GET    /api/webhooks/{id}/deliveries        ?limit=  its events, newest first, with their delivery status
    GET    /api/audit                           ?target=key:12&action=key.rotate&before=&limit=  (newest first)
    GET    /api/groups/{name}/budgets           budgets (console/budgets_api.py)
    POST   /api/groups/{name}/budgets           {"amount", "window", "key_id"?, "timezone"?}
    DELETE /api/budgets/{id}
    GET    /api/groups/{name}/users             ?key=&since=&until=&limit=  usage per end user
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from billing.history import Filter
from billing.store import Group, KeyInfo, KeyMeta, StoreError, UsageRecord
from console import auth, forms, lifecycle, operators, webhooks
from console.app import ADMIN_REFUSED, VIEWER_REFUSED, Console, console_of
from console.changes import Changes
from console.forms import Invalid
from console.keys import key_or_404
from console.operators import Operator
from core.catalog import ConfigError
from core.deployments import is_name
from core.errors import InvalidRequest
from core.inputs import INT64_MAX, decode_json, finite, natural
from core.money import to_credits

META_FIELDS = ("expires_at", "tags", "owner")

MAX_BODY = 64 * 1024
API = Callable[[Console, Request], Awaitable[Response]]


class AdminError(Exception):
    """A refused admin API request: answered with its status and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, code: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.field = status, message, code, field


def error(status: int, message: str, code: str, field: str | None = None, **headers: str) -> JSONResponse:
    kind = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": field, "code": code}},
        status_code=status,
        headers=headers or None,
    )


def guarded(handler: API) -> Callable[[Request], Awaitable[Response]]:
    """The handler behind a token: the admin token (the built-in admin) or an operator's
    (console/operators.py), whose role then decides: a viewer only reads, an operator of some groups
    reaches only theirs (404 for another's, 403 for what is no group's)."""

    async def endpoint(request: Request) -> Response:
        c = console_of(request)
        expected = auth.admin_token(c.settings)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
        operator: Operator | None = None
        if expected and auth.token_matches(given, expected):
            operator = operators.ADMIN
        elif given.startswith(operators.TOKEN_PREFIX):
            await c.ensure()
            operator = await c.queries.operators.by_token(given)
        elif not expected:
            return error(
                403,
                f"The admin API is off: set [console] admin_token (or $ROUTER_CONSOLE_TOKEN), at least "
                f"{auth.MIN_TOKEN} characters, or give an operator a token (router operators token NAME).",
                "admin_api_disabled",
            )
        if operator is None:
            # only bad tokens are throttled: a flood of them from one proxy never locks out the real one
            ip = request.client.host if request.client else "unknown"
            wait = c.throttle.retry_after(ip)
            if wait is not None:
                return error(
                    429,
                    f"Too many failed attempts: retry in {wait} seconds.",
                    "too_many_attempts",
                    **{"retry-after": str(wait)},
                )
            c.throttle.failed(ip)
            return error(
                401,
                "Send the admin token or an operator's token as 'Authorization: Bearer <token>'.",
                "invalid_admin_token",
                **{"www-authenticate": "Bearer"},
            )
        operators.acting(operator)
        if request.method != "GET" and operator.read_only:
            return error(403, VIEWER_REFUSED, "read_only_role")
        await c.ensure()
        try:
            return await handler(c, request)
        except AdminError as p:
            return error(p.status, p.message, p.code, p.field)
        except Invalid as exc:
            return error(400, exc.message, "invalid_value", exc.field)
        except StoreError as exc:
            return error(400, str(exc), "invalid_request")

    return endpoint


async def body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise AdminError(
            415, "Send a JSON body (Content-Type: application/json).", "unsupported_content_type"
        )
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise AdminError(413, "The body is too large.", "request_too_large")
    try:
        data = decode_json(raw or b"{}", bounded=True)  # (an integer of 401 digits is a 400 naming it)
    except InvalidRequest as exc:
        raise AdminError(400, exc.message, exc.code or "invalid_json", exc.param) from None
    if not isinstance(data, dict):
        raise AdminError(400, "The body must be a JSON object.", "invalid_json")
    return data


def amount_text(value: Any, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise Invalid(field, f"'{field}' must be an amount of credits (a string like \"12.5\", or a number).")
    return format(Decimal(str(value)), "f") if isinstance(value, float) else str(value)


def amount(name: str, nano: int | None) -> dict[str, Any]:
    """A money field as the API shows it: a credit string, and the exact nano-credits beside it."""
    return {name: None if nano is None else to_credits(nano), f"{name}_nano": nano}


def group_json(g: Group) -> dict[str, Any]:
    return {
        "id": g.id,
        "name": g.name,
        **amount("balance", g.balance),
        **amount("reserved", g.reserved),
        **amount("spent", g.spent),
        "created_at": g.created_at,
    }


def key_json(k: KeyInfo) -> dict[str, Any]:
    return {
        "id": k.id,
        "group": k.group_name,
        "name": k.name,
        "hint": k.hint,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
        **amount("spend_cap", k.spend_cap),
        **amount("spent", k.spent),
        "allowed_models": list(k.allowed_models) if k.allowed_models else None,
        "expires_at": k.expires_at,
        "tags": list(k.tags),
        "owner": k.owner,
        "last_used_at": k.last_used_at,
        "rotated_until": k.rotated_until,
    }


def usage_json(r: UsageRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "ts": r.ts,
        "key_id": r.key_id,
        "model": r.model,
        "provider": r.provider,
        "deployment": r.deployment,
        "endpoint": r.endpoint,
        "source": r.source,
        "stream": r.stream,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "cached_tokens": r.cached_tokens,
        "cache_write_tokens": r.cache_write_tokens,
        "reasoning_tokens": r.reasoning_tokens,
        "credits": to_credits(r.credits),
        "credits_nano": r.credits,
        "status": r.status,
        "usage_exact": r.usage_exact,
        "latency_ms": r.latency_ms,
        "ttft_ms": r.ttft_ms,
        "request_id": r.request_id,
        "error": r.error,
        "end_user": r.end_user,
        "safety_identifier": r.safety_identifier,
        "metadata": r.metadata,
    }


async def group_of(c: Console, request: Request) -> Group:
    """The path's group, if the operator sees it (404 otherwise, as for no group)."""
    group = await c.store.get_group(request.path_params["name"])
    if group is None or not operators.current().sees(group.name):
        raise AdminError(404, f"No group named {request.path_params['name']!r}.", "group_not_found")
    return group


def every_group() -> None:
    """What spans groups or belongs to none (the audit log, the webhooks): not for an operator of
    some groups."""
    if not operators.current().every_group:
        raise AdminError(403, ADMIN_REFUSED, "admin_only")


def admin_only() -> None:
    """A change that is no group's (a new group, a webhook, the configuration)."""
    if not operators.current().changes(None):
        raise AdminError(403, ADMIN_REFUSED, "admin_only")


async def key_of(c: Console, request: Request) -> KeyInfo:
    try:
        return await key_or_404(c, request.path_params["key_id"])
    except HTTPException:
        raise AdminError(404, f"No key with id {request.path_params['key_id']}.", "key_not_found") from None


MAX_SECONDS = 1e11  # timestamps and widths (year 5138): beyond any use, within every column's range
MIN_WIDTH, MAX_BUCKETS = 60.0, 1000  # the usage buckets: seconds each, and how many one answer holds


def number(params: Any, name: str, kind: type = float, low: float = 0.0) -> Any:
    """The query parameter ``name``: None when absent; a non-negative integer up to 2**63 - 1
    (``kind=int``: ids and cursors, as the stores take them) or a finite float from ``low`` to
    ``MAX_SECONDS``. Anything else is a 400 naming it."""
    text = params.get(name)
    if text in (None, ""):
        return None
    if kind is int:
        value: float | None = natural(text)
        if value is None:
            raise Invalid(name, f"'{name}' must be a whole number from 0 to {INT64_MAX}.")
        return value
    value = finite(text)
    if value is None or not low <= value <= MAX_SECONDS:
        raise Invalid(name, f"'{name}' must be a number from {low:g} to {MAX_SECONDS:.0f}.")
    return value


def allowed_of(c: Console, value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise Invalid("allowed_models", "'allowed_models' must be a list of model ids, or null.")
    return forms.models(",".join(value), "allowed_models", set(c.gateway.catalog.models))


def cap_of(value: Any) -> int | None:
    return None if value is None else forms.credits(amount_text(value, "spend_cap"), "spend_cap")


# -- handlers -------------------------------------------------------------------------------------
async def list_groups(c: Console, request: Request) -> Response:
    seen = [g for g in await c.store.list_groups() if operators.current().sees(g.name)]
    return JSONResponse({"groups": [group_json(g) for g in seen]})


async def create_group(c: Console, request: Request) -> Response:
    admin_only()
    data = await body(request)
    name = forms.group_name(str(data.get("name", "")), "name")
    amount = forms.credits(amount_text(data.get("credits", "0"), "credits"), "credits")
    assert amount is not None
    return JSONResponse(group_json(await changes(c, request).create_group(name, amount)), status_code=201)


async def get_group(c: Console, request: Request) -> Response:
    return JSONResponse(group_json(await group_of(c, request)))


async def topup(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    data = await body(request)
    amount = forms.credits(amount_text(data.get("credits"), "credits"), "credits", positive=True)
    assert amount is not None
    return JSONResponse(group_json(await changes(c, request).topup(group.name, amount)))


async def list_keys(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    return JSONResponse({"keys": [key_json(k) for k in await c.store.list_keys(group.name)]})


async def create_key(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    data = await body(request)
    label = forms.label(str(data.get("name", "")), "name")
    cap, allowed = cap_of(data.get("spend_cap")), allowed_of(c, data.get("allowed_models"))
    meta = lifecycle.meta_of(data)
    key, info = await changes(c, request).create_key(
        c.gateway.settings, group.name, label, cap, allowed, meta
    )
    return JSONResponse(
        {**key_json(info), "key": key}, status_code=201, headers={"cache-control": "no-store"}
    )


async def get_key(c: Console, request: Request) -> Response:
    return JSONResponse(key_json(await key_of(c, request)))


async def update_key(c: Console, request: Request) -> Response:
    info = await key_of(c, request)
    data = await body(request)
    unknown = set(data) - {"spend_cap", "allowed_models", *META_FIELDS}
    if unknown:
        raise Invalid(
            sorted(unknown)[0],
            f"Unknown field '{sorted(unknown)[0]}': use spend_cap, allowed_models, expires_at, tags, owner.",
        )
    cap = cap_of(data["spend_cap"]) if "spend_cap" in data else info.spend_cap
    allowed = (
        allowed_of(c, data["allowed_models"])
        if "allowed_models" in data
        else (list(info.allowed_models) if info.allowed_models else None)
    )
    old = KeyMeta(info.expires_at, info.tags, info.owner)
    meta = lifecycle.meta_of(data, old)
    updated = await changes(c, request).update_key(info, cap, allowed, meta)
    return JSONResponse(key_json(updated))


async def rotate(c: Console, request: Request) -> Response:
    info = await key_of(c, request)
    data = await body(request)
    grace = lifecycle.grace(data.get("grace_seconds", 0))
    key, updated = await changes(c, request).rotate_key(c.gateway.settings, info, grace)
    return JSONResponse({**key_json(updated), "key": key}, headers={"cache-control": "no-store"})


async def revoke_key(c: Console, request: Request) -> Response:
    info = await key_of(c, request)
    done = await changes(c, request).revoke_key(info.id)
    return JSONResponse({"id": info.id, "revoked": True, "already_revoked": not done})


def changes(c: Console, request: Request) -> Changes:
    return c.changes(request, "admin-api")


async def audit_log(c: Console, request: Request) -> Response:
    every_group()
    p = request.query_params
    limit = number(p, "limit", int) or 100
    if not 1 <= limit <= 1000:
        raise Invalid("limit", "'limit' is between 1 and 1000.")
    entries = await c.audit.entries(
        limit, number(p, "before", int), p.get("target") or None, p.get("action") or None
    )
    return JSONResponse(
        {"data": [e.json() for e in entries], "older": entries[-1].id if len(entries) == limit else None}
    )


async def list_webhooks(c: Console, request: Request) -> Response:
    every_group()
    return JSONResponse({"webhooks": [h.json() for h in await c.gateway.alerts.webhooks()]})


async def add_webhook(c: Console, request: Request) -> Response:
    admin_only()
    data = await body(request)
    unknown = set(data) - {"url", "group", "balance_below", "expiry_within", "budgets"}
    if unknown:
        raise Invalid(
            sorted(unknown)[0],
            f"Unknown field '{sorted(unknown)[0]}': use url, group, balance_below, expiry_within, budgets.",
        )
    url = webhooks.url_of(data.get("url"))
    below, within = (
        webhooks.threshold_of(data.get("balance_below")),
        webhooks.within_of(data.get("expiry_within")),
    )
    group = await webhooks.group_of(c, data.get("group"))
    budgets = data.get("budgets", True)
    if not isinstance(budgets, bool):
        raise Invalid("budgets", "'budgets' is true or false.")
    # (last: it resolves the host)
    await webhooks.destination_of(url, c.gateway.settings.alerts.destinations())
    hook = await changes(c, request).add_webhook(c.gateway.alerts, url, group, below, within, budgets)
    # the signing secret, in this answer only
    return JSONResponse(
        {**hook.json(), "secret": hook.secret}, status_code=201, headers={"cache-control": "no-store"}
    )


async def webhook_of(c: Console, request: Request) -> int:
    hook_id = natural(request.path_params["webhook_id"])
    if hook_id is None or await c.gateway.alerts.webhook(hook_id) is None:
        raise AdminError(404, f"No webhook with id {request.path_params['webhook_id']}.", "webhook_not_found")
    return hook_id


async def delete_webhook(c: Console, request: Request) -> Response:
    admin_only()
    hook_id = await webhook_of(c, request)
    await changes(c, request).delete_webhook(c.gateway.alerts, hook_id)
    return JSONResponse({"id": hook_id, "deleted": True})


async def webhook_deliveries(c: Console, request: Request) -> Response:
    every_group()
    hook_id = await webhook_of(c, request)
    limit = number(request.query_params, "limit", int) or 100
    if not 1 <= limit <= 1000:
        raise Invalid("limit", "'limit' is between 1 and 1000.")
    return JSONResponse({"data": [d.json() for d in await c.gateway.alerts.deliveries(hook_id, limit)]})


def usage_filter(request: Request, group_id: int) -> Filter:
    p = request.query_params
    given = p.get("source") or "all"
    if given not in forms.SOURCES:
        raise Invalid("source", "'source' is api or job (or absent for all).")
    source = forms.SOURCES[given]
    model = (p.get("model") or "").strip().lower() or None
    deployment = (p.get("deployment") or "").strip() or None
    if deployment is not None and not is_name(deployment):
        raise Invalid("deployment", "'deployment' is a deployment's name (letters, digits, . _ -).")
    return Filter(
        group_id, source, model, number(p, "key", int), number(p, "since"), number(p, "until"), deployment
    )


async def group_usage(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    f = usage_filter(request, group.id)
    p = request.query_params
    limit = number(p, "limit", int) or 100
    if not 1 <= limit <= 1000:
        raise Invalid("limit", "'limit' is between 1 and 1000.")
    page = await c.history.history(f, limit, before=number(p, "before", int), after=number(p, "after", int))
    return JSONResponse(
        {"data": [usage_json(r) for r in page.rows], "older": page.older, "newer": page.newer}
    )


async def group_buckets(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    f = usage_filter(request, group.id)
    width = number(request.query_params, "width", low=MIN_WIDTH)  # (a tiny width: no bucket count overflows)
    width = 3600.0 if width is None else width
    until = f.until if f.until is not None else time.time()
    since = f.since if f.since is not None else until - 86400.0
    if since >= until:
        raise Invalid("since", "'since' must be before 'until'.")
    count = math.ceil((until - since) / width)
    if count > MAX_BUCKETS:
        raise Invalid(
            "width", f"Pick a width of at least {MIN_WIDTH:g} seconds and at most {MAX_BUCKETS} buckets."
        )
    buckets = await c.history.buckets(f, since, width, count)
    return JSONResponse(
        {
            "width": width,
            "buckets": [
                {
                    "start": b.start,
                    "calls": b.calls,
                    "credits": to_credits(b.credits),
                    "credits_nano": b.credits,
                }
                for b in buckets
            ],
        }
    )


async def key_usage(c: Console, request: Request) -> Response:
    info = await key_of(c, request)
    p = request.query_params
    rows = await c.history.key_models(info.id, info.group_id, number(p, "since"), number(p, "until"))
    return JSONResponse(
        {
            "key_id": info.id,
            "models": [
                {
                    "model": r.name,
                    "calls": r.calls,
                    "errors": r.errors,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "cached_tokens": r.cached_tokens,
                    "reasoning_tokens": r.reasoning_tokens,
                    "credits": to_credits(r.credits),
                    "credits_nano": r.credits,
                }
                for r in rows
            ],
        }
    )


async def reload(c: Console, request: Request) -> Response:
    """``POST /console/api/reload``: the configuration file read again and applied to new calls
    (gateway.state.Gateway.reload), audited; a file that does not load changes nothing (400, the reason)."""
    admin_only()
    gw = c.gateway
    before = {
        "providers": sorted(gw.deployments),
        "deployments": sum(len(d) for d in gw.deployments.values()),
        "models": len(gw.catalog.models),
    }
    try:
        pending = gw.reload_file()
    except ConfigError as exc:
        raise AdminError(400, f"The configuration was not reloaded: {exc}", "invalid_configuration") from None
    after = {
        "providers": sorted(gw.deployments),
        "deployments": sum(len(d) for d in gw.deployments.values()),
        "models": len(gw.catalog.models),
        "at_restart": pending,
    }
    await changes(c, request).record("config.reload", gw.config_path or "settings", before, after)
    return JSONResponse({"reloaded": True, "restart_needed": pending})


def routes() -> list[Route]:
    table: list[tuple[str, API, str]] = [
        ("/api/reload", reload, "POST"),
        ("/api/groups", list_groups, "GET"),
        ("/api/groups", create_group, "POST"),
        ("/api/groups/{name}", get_group, "GET"),
        ("/api/groups/{name}/topup", topup, "POST"),
        ("/api/groups/{name}/keys", list_keys, "GET"),
        ("/api/groups/{name}/keys", create_key, "POST"),
        ("/api/groups/{name}/usage", group_usage, "GET"),
        ("/api/groups/{name}/usage/buckets", group_buckets, "GET"),
        ("/api/keys/{key_id}", get_key, "GET"),
        ("/api/keys/{key_id}", update_key, "PATCH"),
        ("/api/keys/{key_id}/rotate", rotate, "POST"),
        ("/api/keys/{key_id}/revoke", revoke_key, "POST"),
        ("/api/keys/{key_id}/usage", key_usage, "GET"),
        ("/api/audit", audit_log, "GET"),
        ("/api/webhooks", list_webhooks, "GET"),
        ("/api/webhooks", add_webhook, "POST"),
        ("/api/webhooks/{webhook_id}", delete_webhook, "DELETE"),
        ("/api/webhooks/{webhook_id}/deliveries", webhook_deliveries, "GET"),
    ]
    return [Route(path, guarded(handler), methods=[method]) for path, handler, method in table]
