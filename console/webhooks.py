"""Webhooks: reading what an operator gives (the admin API, the console's form, the CLI), and the
console's page: the webhooks, a form to add one (its signing secret shown once), removing one, and the
latest events with their delivery status (pending with its next try, delivered, failed).

A webhook's URL is read in two steps: its form (:func:`url_of`), then where it points
(:func:`destination_of`: a public address, or what ``[alerts] allow_destinations`` lists; its host
resolved now, and again at each send: gateway/alerts.py). One message for every refusal, so that
adding a webhook tells an admin nothing of what a name resolves to."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from console import flash, forms
from console.app import Console, action, every_group, may_change, page
from console.forms import Invalid
from console.lifecycle import duration
from core.destinations import Destinations
from core.inputs import finite, natural
from gateway.alerts import refused

MAX_URL = 2000
NOTICES = {"added": "Webhook added.", "removed": "Webhook removed: it gets no more events."}


def url_of(value: Any, field: str = "url") -> str:
    text = value.strip() if isinstance(value, str) else ""
    parts = urlsplit(text) if text and len(text) <= MAX_URL else None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in text)
    ):
        raise Invalid(field, f"'{field}' must be an http:// or https:// URL with a host.")
    return text


async def destination_of(url: str, allowed: Destinations, field: str = "url") -> str:
    """``url`` (see :func:`url_of`) if a webhook may point there, else a 400 naming ``field``."""
    if await refused(url, allowed):
        raise Invalid(
            field,
            f"'{field}' must point to a public address: private, loopback, link-local, unique-local, "
            "multicast and unspecified addresses, cloud metadata services and hosts that do not "
            "resolve are refused (a receiver inside your network: [alerts] allow_destinations).",
        )
    return url


def threshold_of(value: Any, field: str = "balance_below") -> int | None:
    """Credits (a string or a number), or None / "" for no balance alert; never negative."""
    if value is None or value == "":
        return None
    text = str(value).strip() if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    if text.startswith("-"):
        raise Invalid(field, f"'{field}' cannot be negative.")
    return forms.credits(text, field)


def within_of(value: Any, field: str = "expiry_within") -> float | None:
    """Seconds or a duration (7d), or None / "" for no expiry alert; never negative."""
    if value is None or value == "":
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = duration(value)
        if seconds is None:
            seconds = finite(value.strip())
    if seconds is None:
        raise Invalid(field, f"'{field}' must be a number of seconds or a duration (12h, 7d).")
    if seconds < 0:
        raise Invalid(field, f"'{field}' cannot be negative.")
    return seconds


async def group_of(c: Console, value: Any, field: str = "group") -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or await c.store.get_group(value.strip()) is None:
        raise Invalid(field, f"No group named {str(value)[:60]!r}.")
    return value.strip()


# -- the page -------------------------------------------------------------------------------------
async def webhooks_page(c: Console, request: Request, status: int = 200, **context: Any) -> Response:
    if (refusal := every_group(c, request)) is not None:
        return refusal
    hooks = await c.gateway.alerts.webhooks()
    deliveries = await c.gateway.alerts.deliveries(limit=100)
    secret = None
    token = request.query_params.get("created", "")
    if token and not context.get("errors"):
        secret = await flash.take(c.queries.db, await c.secret(), request.state.session.csrf, token)
    context.setdefault("errors", {})
    context.setdefault("values", {})
    return c.render(
        request,
        "webhooks.html",
        status=status,
        hooks=hooks,
        deliveries=deliveries,
        secret=secret,
        notice=NOTICES.get(request.query_params.get("ok", ""), ""),
        **context,
    )


webhooks = page(webhooks_page)


@action
async def add(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    errors: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, parse in (("url", url_of), ("balance_below", threshold_of), ("expiry_within", within_of)):
        try:
            values[name] = parse(form.get(name, ""), name)
        except Invalid as exc:
            errors[exc.field] = exc.message
    try:
        values["group"] = await group_of(c, form.get("group", ""))
    except Invalid as exc:
        errors[exc.field] = exc.message
    if "url" not in errors:
        try:
            await destination_of(values["url"], c.gateway.settings.alerts.destinations())
        except Invalid as exc:
            errors[exc.field] = exc.message
    if errors:
        return await webhooks_page(c, request, 400, errors=errors, values=form)
    hook = await c.changes(request, "console").add_webhook(
        c.gateway.alerts,
        values["url"],
        values["group"],
        values["balance_below"],
        values["expiry_within"],
        form.get("budgets", "") == "on",
    )
    token = await flash.put(c.queries.db, await c.secret(), request.state.session.csrf, hook.secret)
    return c.redirect(request, "/webhooks", created=token, ok="added")


@action
async def remove(c: Console, request: Request, form: dict[str, str]) -> Response:
    if (refusal := may_change(c, request)) is not None:
        return refusal
    number = natural(request.path_params["webhook_id"])
    if number is not None:
        await c.changes(request, "console").delete_webhook(c.gateway.alerts, number)
    return c.redirect(request, "/webhooks", ok="removed")


def routes() -> list[Route]:
    return [
        Route("/webhooks", webhooks, methods=["GET"]),
        Route("/webhooks", add, methods=["POST"]),
        Route("/webhooks/{webhook_id}/remove", remove, methods=["POST"]),
    ]
