"""Budgets in the console: the Budgets card of a group's page and of a key's (each budget with its
window now, how much of it is used, the webhooks its 50/80/100 % alerts go to) and what its forms do
(add a budget, change its amount, remove it), recorded in the audit log like every change. The
routes hang under a group's page and a key's (:func:`routes`, given by console/groups.py and
console/keys.py how to find their owner and how to show their page again): a budget is changed only
through the page of the group or key it belongs to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing import budgets
from billing.alerts import AlertBook
from billing.budgets import BudgetState
from console import display, forms
from console.app import Console, action
from console.forms import Invalid
from core.inputs import natural
from gateway.alerts import BUDGET_LEVELS

WINDOWS = ("day", "week", "month")  # the calendar windows the form offers (a rolling 30m, 12h or 7d is typed)


async def card(c: Console, group: str, key_id: int | None = None) -> dict[str, Any]:
    """The Budgets card's context: the budgets of the group (all of them) or of one key."""
    states = await budgets.states(c.store, group, key_id)
    hooks = [
        h for h in await AlertBook(c.store.database).webhooks() if h.budgets and h.group in (None, group)
    ]
    amounts = [s.budget.amount for s in states] + [s.spent for s in states]
    return {
        "budgets": states,
        "budget_watchers": len(hooks),
        "budget_levels": BUDGET_LEVELS,
        "budget_windows": WINDOWS,
        "budget_zone": c.gateway.settings.billing.timezone,
        "budget_places": display.places(amounts),
    }


async def add(
    c: Console, request: Request, form: dict[str, str], group: str, key_id: int | None
) -> dict[str, str]:
    """Add the form's budget; the errors by field (none: it was added)."""
    errors: dict[str, str] = {}
    amount: int | None = None
    try:
        amount = forms.credits(form.get("budget_amount", ""), "budget_amount", positive=True)
    except Invalid as exc:
        errors[exc.field] = exc.message
    window = zone = ""
    try:
        window, zone = forms.budget_window(
            form.get("budget_window", ""),
            form.get("budget_timezone", ""),
            c.gateway.settings.billing.timezone,
            ("budget_window", "budget_timezone"),
        )
    except Invalid as exc:
        errors[exc.field] = exc.message
    if key_id is None and form.get("budget_key", "").strip():
        key_id = natural(form["budget_key"].strip())
        if key_id is None:
            errors["budget_key"] = "Choose the group or one of its keys."
    if errors or amount is None:
        return errors
    try:
        await c.changes(request, "console").add_budget(group, amount, window, key_id, zone)
    except budgets.BudgetError as exc:
        return {"budget_key": str(exc)}
    return {}


async def owned(c: Console, budget_id: str, group: str, key_id: int | None) -> BudgetState | None:
    """The budget with this id if it belongs to this group (and this key, on a key's page)."""
    found = natural(budget_id)
    states = await budgets.states(c.store, group, key_id) if found is not None else []
    return next((s for s in states if s.budget.id == found), None)


async def set_amount(
    c: Console, request: Request, form: dict[str, str], state: BudgetState
) -> dict[str, str]:
    field = f"budget_set_{state.budget.id}"
    try:
        amount = forms.credits(form.get("amount", ""), field, positive=True)
    except Invalid as exc:
        return {exc.field: exc.message}
    assert amount is not None
    await c.changes(request, "console").set_budget_amount(state.budget.id, amount)
    return {}


async def remove(c: Console, request: Request, state: BudgetState) -> None:
    await c.changes(request, "console").remove_budget(state.budget.id)


# (group, key id or None, the page's path): whose budgets a request's path is about
Owner = Callable[[Console, Request], Awaitable[tuple[str, int | None, str]]]
Page = Callable[..., Awaitable[Response]]  # the owner's page again: (c, request, status, errors=, values=)


def routes(prefix: str, owner: Owner, page: Page) -> list[Route]:
    """The budget forms' routes under ``prefix`` (``/groups/{name}``, ``/keys/{key_id}``)."""

    async def added(c: Console, request: Request, form: dict[str, str]) -> Response:
        group, key_id, path = await owner(c, request)
        errors = await add(c, request, form, group, key_id)
        if errors:
            return await page(c, request, 400, errors=errors, values=form)
        return c.redirect(request, path, "budgets", ok="budget-added")

    async def found(c: Console, request: Request) -> tuple[BudgetState, str]:
        group, key_id, path = await owner(c, request)
        state = await owned(c, request.path_params["budget_id"], group, key_id)
        if state is None:
            raise HTTPException(404, "No such budget here.")
        return state, path

    async def changed(c: Console, request: Request, form: dict[str, str]) -> Response:
        state, path = await found(c, request)
        errors = await set_amount(c, request, form, state)
        if errors:
            values = {f"budget_set_{state.budget.id}": form.get("amount", "")}
            return await page(c, request, 400, errors=errors, values=values)
        return c.redirect(request, path, "budgets", ok="budget-updated")

    async def removed(c: Console, request: Request, form: dict[str, str]) -> Response:
        state, path = await found(c, request)
        await remove(c, request, state)
        return c.redirect(request, path, "budgets", ok="budget-removed")

    return [
        Route(f"{prefix}/budgets", action(added), methods=["POST"]),
        Route(f"{prefix}/budgets/{{budget_id}}", action(changed), methods=["POST"]),
        Route(f"{prefix}/budgets/{{budget_id}}/remove", action(removed), methods=["POST"]),
    ]
