"""The operators page (``/console/operators``): the accounts and their roles for whoever sees across
groups (an admin, a viewer); an admin adds one (name, role, groups, a first password), sets a new
password (its sessions end) or removes one. The rules are console/operators.py's and the changes
console/changes.py's, as for the CLI (``router operators``), which alone makes API tokens."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from console import auth, operators
from console.app import Console, action, every_group, may_change, page

NOTICES = {
    "added": "Operator added.",
    "password": "Password set: that operator's sessions have ended.",
    "removed": "Operator removed: its sessions have ended and its API token no longer works.",
}


async def accounts_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    if (refusal := every_group(c, request)) is not None:
        return refusal
    context.setdefault("errors", {})
    context.setdefault("values", {})
    return c.render(
        request,
        "operators.html",
        status=status,
        accounts=await c.queries.operators.all(),
        roles=operators.ROLES,
        me=operators.current().name,
        notice=NOTICES.get(request.query_params.get("ok", ""), ""),
        **context,
    )


accounts = page(accounts_page)


def _groups(text: str) -> list[str]:
    return [g.strip() for g in text.replace(",", " ").split() if g.strip()]


@action
async def add(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    errors: dict[str, str] = {}
    name, role = form.get("name", "").strip().lower(), form.get("role", "")
    password = form.get("password", "")
    if (problem := auth.password_problem(password)) is not None:
        errors["password"] = problem
    if not errors:
        try:
            hashed = await asyncio.to_thread(auth.hash_password, password)  # (scrypt: off the event loop)
            await c.changes(request, "console").add_operator(
                c.queries.operators, name, role, _groups(form.get("groups", "")), hashed
            )
        except operators.OperatorError as exc:
            errors[exc.field] = str(exc)
    if errors:
        return await accounts_page(
            c, request, 400, errors=errors, values={k: v for k, v in form.items() if k != "password"}
        )
    return c.redirect(request, "/operators", ok="added")


@action
async def password(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    name, given = form.get("name", ""), form.get("password", "")
    values = {"account": name}
    if (problem := auth.password_problem(given)) is not None:
        return await accounts_page(c, request, 400, errors={"new-password": problem}, values=values)
    try:
        hashed = await asyncio.to_thread(auth.hash_password, given)
        await c.changes(request, "console").operator_password(c.queries.operators, name, hashed)
    except operators.OperatorError as exc:
        return await accounts_page(c, request, 404, errors={"new-password": str(exc)}, values=values)
    return c.redirect(request, "/operators", ok="password")


@action
async def remove(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    name = request.path_params["name"]
    if name == operators.current().name:
        return await accounts_page(
            c,
            request,
            400,
            errors={f"remove-{name}": "You cannot remove the account you are signed in with."},
        )
    try:
        await c.changes(request, "console").remove_operator(c.queries.operators, name)
    except operators.OperatorError as exc:
        return await accounts_page(c, request, 404, errors={f"remove-{name}": str(exc)})
    return c.redirect(request, "/operators", ok="removed")


def routes() -> list[Route]:
    return [
        Route("/operators", accounts, methods=["GET"]),
        Route("/operators", add, methods=["POST"]),
        Route("/operators/password", password, methods=["POST"]),
        Route("/operators/{name}/remove", remove, methods=["POST"]),
    ]
