"""The console's pages: login and logout, the display choice (UTC or a time zone), and the routes of
every page: the overview (console/overview.py), groups (console/groups.py), keys (console/keys.py),
calls (console/calls.py) and batches (console/batches.py).

Reads are GET pages that work without JavaScript; every change is a POST form with the CSRF token,
answered by a redirect (post/redirect/get: a reload repeats nothing), or, for a validation error, by
the same page with the error beside the field. What cannot be undone (revoking a key, cancelling a
batch) is asked first, on a page of its own.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console import audit, auth, batches, calls, groups, keys, operators, overview, prefs, webhooks
from console.app import Console, console_of, page, personal, read_form, same_origin


def client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


# -- login ----------------------------------------------------------------------------------------
async def login_form(request: Request) -> Response:
    c = console_of(request)
    await c.ensure()
    session = await c.session(request)
    if session is not None and session.admin:
        return c.redirect(request, "/")
    if session is None:
        session = auth.Session.anonymous(c.settings.session_seconds)
    request.state.session = session
    response = await login_page(c, request)
    await c.set_cookie(response, request, session)
    return response


async def login_page(c: Console, request: Request, error: str = "", status: int = 200) -> Response:
    target = request.query_params.get("next", "")
    configured = bool(auth.admin_token(c.settings) or await c.password_hash() or await c.queries.operators.all())
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
    # counted before the check, so that guesses sent at once are bounded too; a browser that logged in
    # before counts on its own (console/auth.py, Throttling)
    device = await c.device(request)
    name = form.get("name", "").strip().lower()[:64] or operators.BUILT_IN
    windows = c.login_windows(client_ip(request), device, name if operators.NAME.fullmatch(name) else "?")
    attempt = await c.gateway.attempts.take(windows, c.settings.login_window_seconds)
    if attempt.wait:
        wait = attempt.wait
        response = await login_page(c, request, f"Too many failed logins: try again in {wait} seconds.", 429)
        response.headers["retry-after"] = str(wait)
        return response
    operator = await c.check_login(form.get("password", ""), name)
    if operator is None:
        return await login_page(c, request, "Wrong name or password.", 401)  # (the attempt keeps its place)
    await c.gateway.attempts.clear(windows[:1])  # the IP's (or device's) count starts again
    await c.gateway.attempts.give_back(attempt, windows[1:])  # and the account's place is free
    fresh = await c.log_in(operator)
    response = RedirectResponse(c.safe(request, form.get("next", ""), "/"), status_code=303)
    await c.set_cookie(response, request, fresh)
    if device is None:
        await c.set_device_cookie(response, request)
    return response


async def _form(request: Request) -> dict[str, str] | None:
    return await read_form(request) if same_origin(request) else None


@personal
async def logout(c: Console, request: Request, form: dict[str, str]) -> Response:
    await c.log_out(request.state.session)  # a replayed copy of the cookie opens nothing from now on
    response = c.redirect(request, "/login")
    await c.set_cookie(response, request, None)
    return response


# -- display ----------------------------------------------------------------------------------------
@page
async def display_page(c: Console, request: Request) -> Response:
    back = c.safe(request, request.query_params.get("back", ""), "/")
    return c.render(request, "display.html", zones=sorted(prefs.zones()), back=back)


@personal
async def set_display(c: Console, request: Request, form: dict[str, str]) -> Response:
    """Times in UTC, or in a zone: the one picked on the display page, or the browser's (the header's
    switch: console.js fills it in)."""
    name = form.get("zone", "UTC")
    if name == "local":
        name = form.get("browser", "")
    back = c.safe(request, form.get("back", ""), "/")
    if not prefs.valid(name):
        return c.render(request, "display.html", status=400, zones=sorted(prefs.zones()), back=back,
                        error="Pick a time zone from the list (your browser did not say which is yours).")  # fmt: skip
    response = RedirectResponse(back, status_code=303)
    response.set_cookie(prefs.COOKIE, name, max_age=prefs.YEAR, path=request.scope.get("root_path") or "/",
                        secure=c.settings.secure_cookies, httponly=True, samesite="strict")  # fmt: skip
    return response


def routes() -> list[Route]:
    return [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/display", display_page, methods=["GET"]),
        Route("/display", set_display, methods=["POST"]),
        *overview.routes(),
        *groups.routes(),
        *keys.routes(),
        *calls.routes(),
        *batches.routes(),
        *audit.routes(),
        *webhooks.routes(),
    ]
