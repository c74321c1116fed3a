"""What the console's pages and its admin API share (``console.site.console_app`` assembles them into
the sub-app that ``router.app.create_app`` mounts at ``/console``). Pages are in
:mod:`console.pages`, the admin JSON API in :mod:`console.api`; this module holds
the ``Console`` object (templates, queries, credentials, throttle, aggregates), the ``page`` /
``action`` wrappers (login required; forms also need the session's CSRF token), the static files and
the security headers (scripts only from the console itself: ``console.js``, which the pages do not
need to work).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from billing.analysis import Analysis
from billing.audit import Audit
from billing.history import History
from billing.store import Store
from console import auth, display, operators, prefs
from console.changes import Changes
from console.forms import MAX_FORM_BYTES, form_data
from console.operators import Operator
from console.queries import Queries, queries_for
from console.sso import OIDC
from gateway.attempts import Window

if TYPE_CHECKING:
    from gateway.state import Gateway

HERE = Path(__file__).resolve().parent
COOKIE = "mr_console"
DEVICE_COOKIE = "mr_console_device"  # this browser has logged in before (console/auth.py, Throttling)
CACHE_SECONDS = 5.0  # how soon a password set by the CLI (in the store) takes effect
ACCOUNT = "admin"  # the login's one account: the admin password (or token)
STATIC = {name: (HERE / "static" / name).read_bytes() for name in ("console.css", "console.js")}
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]

Handler = Callable[["Console", Request], Awaitable[Response]]
FormHandler = Callable[["Console", Request, dict[str, str]], Awaitable[Response]]


@jinja2.pass_context
def _when(context: Any, ts: float | None) -> str:
    """A time on the zone the admin chose (the page's ``zone``)."""
    return display.when(ts, context.get("zone", display.UTC))


def _wbr(text: str) -> Markup:
    """``text`` escaped, breaking only after a ``/`` (a model id between its provider and its name,
    never at a hyphen or inside a word)."""
    parts = str(text).split("/")
    pieces = [p + "/" for p in parts[:-1]] + parts[-1:]
    return Markup("").join(Markup('<span class="nb">{}</span>').format(escape(p)) for p in pieces)


class Console:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings.console
        self._queries: Queries | None = None
        s = self.settings
        # the admin API's bad tokens (the login form's attempts: gateway.attempts, login_windows)
        self.throttle = auth.Throttle(
            s.login_attempts_per_ip, s.login_attempts_global, s.login_window_seconds
        )
        self._cached: dict[str, tuple[str, float]] = {}
        self.sso = OIDC()  # single sign-on's issuer, when [console] oidc_issuer is set (console/sso.py)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            credits=display.exact,
            fixed=display.fixed,
            places=display.places,
            tokens=display.count,
            count=display.count,
            ms=display.ms,
            when=_when,
            iso=display.iso,
            q=lambda s: quote(str(s), safe=""),
            wbr=_wbr,
        )
        self.env.globals.update(percent=display.percent)
        self._analysis: Analysis | None = None
        self._audit: Audit | None = None

    @property
    def store(self) -> Store:
        return self.gateway.store

    @property
    def queries(self) -> Queries:
        if self._queries is None:
            self._queries = queries_for(self.gateway.store)
        return self._queries

    @property
    def history(self) -> History:
        return self.gateway.store.history

    @property
    def analysis(self) -> Analysis:
        if self._analysis is None:
            self._analysis = Analysis(self.gateway.store.history)
        return self._analysis

    @property
    def audit(self) -> Audit:
        if self._audit is None:
            self._audit = Audit(self.gateway.store.database)
        return self._audit

    def changes(self, request: Request, surface: str) -> Changes:
        """The operator's changes made through this request, recorded as ``<surface>:<operator>
        (<address>)`` (``console:alice (10.0.0.7)``, ``admin-api:admin (127.0.0.1)``)."""
        ip = request.client.host if request.client else "unknown"
        return Changes(
            self.store, self.audit, f"{surface}:{operators.current().name} ({ip})", self.gateway.auth.forget
        )

    def model_ids(self) -> list[str]:
        return sorted(m.id for m in self.gateway.catalog.models.values())

    def deployment_names(self) -> list[str]:
        """The names of every provider's deployments (the usage filter offers them)."""
        return sorted({d.name for deps in self.gateway.deployments.values() for d in deps})

    async def ensure(self) -> None:
        if not self.gateway.started:
            await self.gateway.start()
        await self.queries.ready()

    # -- credentials (cached a few seconds: the CLI may change them in the store) ------------------
    async def _setting(self, name: str, make: Callable[[], str] | None = None) -> str:
        hit = self._cached.get(name)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        if make is not None:
            value = await self.queries.setting_or_default(name, make())
        else:
            value = await self.queries.get_setting(name) or ""
        self._cached[name] = (value, now + CACHE_SECONDS)
        return value

    async def secret(self) -> str:
        if self.settings.session_secret:
            return self.settings.session_secret
        return await self._setting(auth.SECRET_SETTING, lambda: auth.secrets.token_urlsafe(32))

    async def password_hash(self) -> str:
        return self.settings.password_hash or await self._setting(auth.PASSWORD_SETTING)

    def forget(self) -> None:
        self._cached.clear()

    async def session(self, request: Request) -> auth.Session | None:
        """The request's session; a logged-in one only while its row in the store says so (not logged
        out, and logged in with the credentials that are current: its operator's, or the built-in
        admin's). The session's operator is then ``request.state.operator`` and the request's
        :func:`console.operators.current`."""
        session = auth.read_session(request.cookies.get(COOKIE), await self.secret())
        if session is not None and session.admin:
            held = await self.queries.session_credential(session.sid_hash)
            operator = await self.operator_of(held[1]) if held is not None else None
            if (
                held is None
                or operator is None
                or not hmac.compare_digest(held[0], await self.fingerprint(operator))
            ):
                return None
            request.state.operator = operator
            operators.acting(operator)
        return session

    async def operator_of(self, name: str | None) -> Operator | None:
        return operators.ADMIN if name is None else await self.queries.operators.get(name)

    async def fingerprint(self, operator: Operator = operators.ADMIN) -> str:
        if operator.name != operators.BUILT_IN:
            return operator.fingerprint
        return auth.fingerprint(await self.password_hash(), auth.admin_token(self.settings))

    async def log_in(self, operator: Operator = operators.ADMIN) -> auth.Session:
        session = auth.Session.logged_in(self.settings.session_seconds)
        name = None if operator.name == operators.BUILT_IN else operator.name
        await self.queries.session_start(
            session.sid_hash, await self.fingerprint(operator), session.expires, name
        )
        return session

    async def log_out(self, session: auth.Session) -> None:
        await self.queries.session_end(session.sid_hash)

    async def check_login(self, password: str, name: str = "") -> Operator | None:
        """The operator these credentials are: a named operator's password, or (no name, or
        ``admin``) the admin password or token."""
        if name and name != operators.BUILT_IN:
            found = await self.queries.operators.get(name)
            ok = found is not None and await asyncio.to_thread(
                auth.verify_password, password, found.password_hash
            )
            return found if ok else None
        token = auth.admin_token(self.settings)
        if auth.token_matches(password, token):
            return operators.ADMIN
        stored = await self.password_hash()
        ok = bool(stored) and await asyncio.to_thread(auth.verify_password, password, stored)
        return operators.ADMIN if ok else None

    def login_windows(self, ip: str, device: str | None = None, account: str = ACCOUNT) -> list[Window]:
        """Where a login attempt at ``account`` is counted (console/auth.py, Throttling): on a browser
        that logged in as that account before (``device``), else on its client IP's count for that
        account; and always on the account, whose window holds every IP's and every device's attempts
        (``login_attempts_global``). The first is what a success clears."""
        s = self.settings
        own = f"login:device:{device}" if device else f"login:ip:{ip}:{account}"
        return [
            Window(own, s.login_attempts_per_ip),
            Window(f"login:account:{account}", s.login_attempts_global),
        ]

    async def device(self, request: Request, account: str) -> str | None:
        """This browser's device id, if its cookie was earned on ``account``."""
        return auth.read_device(request.cookies.get(DEVICE_COOKIE), await self.secret(), account)

    async def set_device_cookie(self, response: Response, request: Request, account: str) -> None:
        response.set_cookie(
            DEVICE_COOKIE,
            auth.new_device(await self.secret(), account),
            max_age=int(auth.DEVICE_SECONDS),
            path=request.scope.get("root_path") or "/",
            secure=self.settings.secure_cookies,
            httponly=True,
            samesite="strict",
        )

    async def set_cookie(self, response: Response, request: Request, session: auth.Session | None) -> None:
        path = request.scope.get("root_path") or "/"
        if session is None:
            response.delete_cookie(
                COOKIE, path=path, secure=self.settings.secure_cookies, httponly=True, samesite="strict"
            )
            return
        response.set_cookie(
            COOKIE,
            auth.sign_session(session, await self.secret()),
            max_age=int(session.expires - time.time()),
            path=path,
            secure=self.settings.secure_cookies,
            httponly=True,
            samesite="strict",
        )

    # -- rendering ------------------------------------------------------------------------------
    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        session: auth.Session | None = getattr(request.state, "session", None)
        base = request.scope.get("root_path", "")
        zone = prefs.zone_of(request)
        context.setdefault("zone", zone)
        operator: Operator | None = getattr(request.state, "operator", None)
        offers = operator or operators.ADMIN  # (a page before its session is known offers no form anyway)
        html = self.env.get_template(template).render(
            base=base,
            csrf=session.csrf if session else "",
            admin=bool(session and session.admin),
            operator=operator,
            # what the page offers: the forms a viewer (or an operator, for what is no group's) may not use are left out
            can_change=not offers.read_only,
            can_admin=offers.changes(None),
            path=request.url.path,
            current=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            zone_name=display.zone_label(zone, time.time()),
            **context,
        )
        return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})

    @staticmethod
    def base(request: Request) -> str:
        """Where the console is mounted (``/console``)."""
        return str(request.scope.get("root_path", ""))

    def safe(self, request: Request, target: str, default: str) -> str:
        """``target`` if it is a page of this console, else ``default`` (a console path): where a form
        may send the browser back to."""
        base = self.base(request)
        if target.startswith(base + "/") and not target.startswith("//") and "\\" not in target:
            return target
        return base + default

    def redirect(self, request: Request, path: str, fragment: str = "", **query: Any) -> RedirectResponse:
        url = request.scope.get("root_path", "") + path
        params = {k: v for k, v in query.items() if v is not None}
        url += ("?" + urlencode(params) if params else "") + (f"#{fragment}" if fragment else "")
        return RedirectResponse(url, status_code=303)


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def login_redirect(c: Console, request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return c.redirect(request, "/login", next=target)


def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A page only a logged-in admin sees; anyone else is sent to the login page."""

    async def endpoint(request: Request) -> Response:
        c = console_of(request)
        await c.ensure()
        session = await c.session(request)
        if session is None or not session.admin:
            return login_redirect(c, request)
        request.state.session = session
        return await handler(c, request)

    return endpoint


async def read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded body, or None if it is not one (or too large)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    return form_data(body)


def same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def refused(c: Console, request: Request, message: str, status: int = 403) -> Response:
    return c.render(request, "error.html", status=status, title="Refused", message=message)


def action(handler: FormHandler, personal: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """A form post: a logged-in operator, a same-origin request, an urlencoded body with the CSRF
    token; not a viewer, unless the form is ``personal`` (logging out, the display's time zone). An
    operator of some groups reaches only their things (the handlers find them through
    ``group_or_404`` / ``key_or_404``, which answer 404 for another group's)."""

    async def checked(c: Console, request: Request) -> Response:
        form = await read_form(request)
        if form is None:
            return refused(c, request, "The form could not be read (expected an urlencoded body).", 400)
        if not same_origin(request) or not auth.csrf_ok(request.state.session, form.get("csrf")):
            return refused(
                c, request, "The form's security token is missing or wrong: reload the page and try again."
            )
        if not personal and operators.current().read_only:
            return refused(c, request, VIEWER_REFUSED)
        return await handler(c, request, form)

    return page(checked)


def personal(handler: FormHandler) -> Callable[[Request], Awaitable[Response]]:
    """A form post of the operator's own (any role may)."""
    return action(handler, personal=True)


VIEWER_REFUSED = "Your role is viewer: it sees and exports everything, and changes nothing."
ADMIN_REFUSED = "This is for an admin: your role operates only the groups it was given."


def every_group(c: Console, request: Request) -> Response | None:
    """None if the request's operator may see across groups, else the page that says it may not."""
    return None if operators.current().every_group else refused(c, request, ADMIN_REFUSED)


def may_change(c: Console, request: Request, group: str | None = None) -> Response | None:
    """None if the request's operator may change this group's things (None: what is no group's)."""
    return None if operators.current().changes(group) else refused(c, request, ADMIN_REFUSED)
