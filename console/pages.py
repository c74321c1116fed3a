"""The console's pages: login and logout, the display choice (UTC or a time zone), and the routes of
every page: the overview (console/overview.py), groups (console/groups.py), keys (console/keys.py),
calls (console/calls.py) and batches (console/batches.py).

Reads are GET pages that work without JavaScript; every change is a POST form with the CSRF token,
answered by a redirect (post/redirect/get: a reload repeats nothing), or, for a validation error, by
the same page with the error beside the field. What cannot be undone (revoking a key, cancelling a
batch) is asked first, on a page of its own.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console import (
    accounts,
    audit,
    auth,
    batches,
    calls,
    groups,
    keys,
    operators,
    overview,
    prefs,
    sso,
    webhooks,
)
from console.app import Console, console_of, page, personal, read_form, same_origin
from gateway.attempts import Window


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
    configured = bool(
        auth.admin_token(c.settings) or await c.password_hash() or await c.queries.operators.all()
    )
    return c.render(
        request,
        "login.html",
        status=status,
        error=error,
        next=target,
        configured=configured,
        sso=sso.enabled(c.settings),
    )


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
    # counted before the check, so that guesses sent at once are bounded too; always on the account, and
    # on this browser's device instead of its IP if it logged in as that account before (console/auth.py)
    name = form.get("name", "").strip().lower()[:64] or operators.BUILT_IN
    account = name if operators.NAME.fullmatch(name) else "?"
    device = await c.device(request, account)
    windows = c.login_windows(client_ip(request), device, account)
    attempt = await c.gateway.attempts.take(windows, c.settings.login_window_seconds)
    if attempt.wait:
        wait = attempt.wait
        response = await login_page(c, request, f"Too many failed logins: try again in {wait} seconds.", 429)
        response.headers["retry-after"] = str(wait)
        return response
    operator = await c.check_login(form.get("password", ""), name)
    if operator is None:
        return await login_page(c, request, "Wrong name or password.", 401)  # (the attempt keeps its place)
    await c.gateway.attempts.clear(windows[:1])  # this IP's (or device's) count at this account starts again
    await c.gateway.attempts.give_back(attempt, windows[1:])  # and the account's place is free
    fresh = await c.log_in(operator)
    response = RedirectResponse(c.safe(request, form.get("next", ""), "/"), status_code=303)
    await c.set_cookie(response, request, fresh)
    if device is None:
        await c.set_device_cookie(response, request, account)
    return response


async def _form(request: Request) -> dict[str, str] | None:
    return await read_form(request) if same_origin(request) else None


@personal
async def logout(c: Console, request: Request, form: dict[str, str]) -> Response:
    await c.log_out(request.state.session)  # a replayed copy of the cookie opens nothing from now on
    response = c.redirect(request, "/login")
    await c.set_cookie(response, request, None)
    return response


# -- single sign-on (console/sso.py) --------------------------------------------------------------
def sso_redirect_uri(c: Console, request: Request) -> str:
    origin = f"{request.url.scheme}://{request.url.netloc}"
    return c.settings.oidc_redirect_uri or f"{origin}{c.base(request)}/sso/callback"


async def sso_refused(c: Console, request: Request, exc: sso.SSOError) -> Response:
    session = await c.session(request) or auth.Session.anonymous(c.settings.session_seconds)
    request.state.session = session
    response = await login_page(c, request, f"Single sign-on failed: {exc}.", exc.status)
    await c.set_cookie(response, request, session)
    if exc.status == 503:
        response.headers["retry-after"] = str(sso.RETRY_AFTER)
    return response


async def sso_console(request: Request) -> tuple[Console, Response | None]:
    """The console, and the 404 to answer if single sign-on is not configured."""
    c = console_of(request)
    await c.ensure()
    return c, None if sso.enabled(c.settings) else Response(
        "single sign-on is not configured", status_code=404
    )


async def sso_start(request: Request) -> Response:
    c, off = await sso_console(request)
    if off is not None:
        return off
    flow = sso.Flow.new(c.safe(request, request.query_params.get("next", ""), "/"))
    try:
        async with sso.client() as http:
            issuer = await c.sso.issuer(http, c.settings)
    except sso.SSOError as exc:
        return await sso_refused(c, request, exc)
    response = RedirectResponse(
        c.sso.authorize_url(issuer, c.settings, flow, sso_redirect_uri(c, request)), 303
    )
    response.set_cookie(
        sso.FLOW_COOKIE,
        auth.sign(flow.data(), await c.secret()),
        max_age=sso.FLOW_SECONDS,
        path=request.scope.get("root_path") or "/",
        secure=c.settings.secure_cookies,
        httponly=True,
        samesite="lax",
    )
    return response


async def sso_callback(request: Request) -> Response:
    c, off = await sso_console(request)
    if off is not None:
        return off
    params = request.query_params
    flow = sso.Flow.of(auth.signed(request.cookies.get(sso.FLOW_COOKIE), await c.secret()))
    try:
        if params.get("error"):
            raise sso.SSOError(
                f"the identity provider refused it ({params.get('error_description') or params['error']})"
            )
        if flow is None or not hmac.compare_digest(flow.state, params.get("state", "")):
            raise sso.SSOError("it expired, or did not start in this browser: try again", 400)
        once = Window("sso:state:" + hashlib.sha256(flow.state.encode()).hexdigest(), 1)  # (console/sso.py)
        if (await c.gateway.attempts.take([once], sso.FLOW_SECONDS)).wait:
            raise sso.SSOError("this sign-in was used already: start again", 400)
        async with sso.client() as http:
            name = await c.sso.username(
                http, c.settings, flow, params.get("code", ""), sso_redirect_uri(c, request)
            )
        operator = None
        if operators.NAME.fullmatch(name) and name != operators.BUILT_IN:
            operator = await c.queries.operators.get(name)
        if operator is None:
            raise sso.SSOError(
                f"no operator account is named {name[:64]!r} (an admin makes one: router operators add)", 403
            )
    except sso.SSOError as exc:
        response = await sso_refused(c, request, exc)
    else:
        session = await c.log_in(operator)
        request.state.session, request.state.operator = session, operator
        response = c.render(request, "signed_in.html", target=c.safe(request, flow.next, "/"))
        await c.set_cookie(response, request, session)
    # one use, whatever came of it
    response.delete_cookie(sso.FLOW_COOKIE, path=request.scope.get("root_path") or "/")
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
        return c.render(
            request,
            "display.html",
            status=400,
            zones=sorted(prefs.zones()),
            back=back,
            error="Pick a time zone from the list (your browser did not say which is yours).",
        )
    response = RedirectResponse(back, status_code=303)
    response.set_cookie(
        prefs.COOKIE,
        name,
        max_age=prefs.YEAR,
        path=request.scope.get("root_path") or "/",
        secure=c.settings.secure_cookies,
        httponly=True,
        samesite="strict",
    )
    return response


def routes() -> list[Route]:
    return [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/sso", sso_start, methods=["GET"]),
        Route("/sso/callback", sso_callback, methods=["GET"]),
        Route("/display", display_page, methods=["GET"]),
        Route("/display", set_display, methods=["POST"]),
        *overview.routes(),
        *groups.routes(),
        *keys.routes(),
        *calls.routes(),
        *batches.routes(),
        *audit.routes(),
        *accounts.routes(),
        *webhooks.routes(),
    ]
