"""The admin API's budgets and end users (console/api.py has the rest and the auth around them).

GET    /api/groups/{name}/budgets      the group's and its keys' budgets, each with its window now
POST   /api/groups/{name}/budgets      {"amount", "window", "key_id"?, "timezone"?} -> 201
PATCH  /api/budgets/{id}               {"amount"}: its new amount (its window and spend stay)
DELETE /api/budgets/{id}
GET    /api/groups/{name}/users        ?key=&since=&until=&limit=  usage per end user (the request's
                                       ``user``), most credits first
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from billing import budgets, end_users
from console import forms, operators
from console.api import API, AdminError, amount_text, body, changes, group_of, guarded, number
from console.app import Console
from console.forms import Invalid
from core.inputs import INT64_MAX, natural
from core.money import to_credits


async def list_budgets(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    return JSONResponse({"budgets": [s.as_dict() for s in await budgets.states(c.store, group.name)]})


async def create_budget(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    data = await body(request)
    amount = forms.credits(amount_text(data.get("amount"), "amount"), "amount", positive=True)
    assert amount is not None
    window, tz = forms.budget_window(
        data.get("window"), data.get("timezone"), c.gateway.settings.billing.timezone
    )
    key_id = data.get("key_id")
    if key_id is not None and (
        isinstance(key_id, bool) or not isinstance(key_id, int) or not 1 <= key_id <= INT64_MAX
    ):
        raise Invalid("key_id", "'key_id' must be the id of one of the group's keys, or null.")
    try:
        made = await changes(c, request).add_budget(group.name, amount, window, key_id, tz)
    except budgets.BudgetError as exc:
        raise Invalid("key_id", str(exc)) from None
    return JSONResponse(made.as_dict(), status_code=201)


async def _budget_id(c: Console, request: Request) -> int:
    """The path's budget, if the operator sees its group (404 otherwise, as for no budget)."""
    text = request.path_params["budget_id"]
    budget_id = natural(text)  # ("²".isdigit() is True; 10**20 is past every store's integers)
    found = await budgets.state(c.store, budget_id) if budget_id is not None else None
    if found is None or not operators.current().sees(found.group_name):
        raise AdminError(404, f"No budget with id {text[:40]}.", "budget_not_found")
    return found.budget.id


async def update_budget(c: Console, request: Request) -> Response:
    budget_id = await _budget_id(c, request)
    data = await body(request)
    amount = forms.credits(amount_text(data.get("amount"), "amount"), "amount", positive=True)
    assert amount is not None
    after = await changes(c, request).set_budget_amount(budget_id, amount)
    if after is None:
        raise AdminError(404, f"No budget with id {budget_id}.", "budget_not_found")
    return JSONResponse(after.as_dict())


async def delete_budget(c: Console, request: Request) -> Response:
    budget_id = await _budget_id(c, request)
    if await changes(c, request).remove_budget(budget_id) is None:
        raise AdminError(404, f"No budget with id {budget_id}.", "budget_not_found")
    return JSONResponse({"id": budget_id, "deleted": True})


async def users(c: Console, request: Request) -> Response:
    group = await group_of(c, request)
    p = request.query_params
    until = number(p, "until") or time.time()
    since = number(p, "since") if number(p, "since") is not None else until - 30 * 86400.0
    limit = number(p, "limit", int) or 100
    if not 1 <= limit <= 1000:
        raise Invalid("limit", "'limit' is between 1 and 1000.")
    rows = await end_users.per_user(c.store.database, group.id, since, until, number(p, "key", int), limit)
    return JSONResponse({"since": since, "until": until, "users": [_user(u) for u in rows]})


def _user(u: end_users.UserUsage) -> dict[str, Any]:
    return {
        "user": u.user,
        "calls": u.calls,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "credits": to_credits(u.credits),
        "credits_nano": u.credits,
        "last_ts": u.last_ts,
    }


def routes() -> list[Route]:
    table: list[tuple[str, API, str]] = [
        ("/api/groups/{name}/budgets", list_budgets, "GET"),
        ("/api/groups/{name}/budgets", create_budget, "POST"),
        ("/api/budgets/{budget_id}", update_budget, "PATCH"),
        ("/api/budgets/{budget_id}", delete_budget, "DELETE"),
        ("/api/groups/{name}/users", users, "GET"),
    ]
    return [Route(path, guarded(handler), methods=[method]) for path, handler, method in table]
