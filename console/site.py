"""The console as one ASGI app: its routes (the pages, the admin API, the static files), its
middleware (security headers, settlements made durable first) and its error pages, around a
:class:`console.app.Console` of the gateway."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from console import api, budgets_api, pages
from console.app import SECURITY_HEADERS, STATIC, Console, console_of
from core.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from gateway.state import Gateway


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        raise HTTPException(404)
    kind = "text/css" if name.endswith(".css") else "text/javascript"
    return Response(STATIC[name], media_type=kind, headers={"cache-control": "public, max-age=3600"})


class Headers:
    """The security headers, and ``Server-Timing: app;dur=<ms>`` (the time from the request to its
    headers: the console bench reads it), on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                spent = f"app;dur={(time.perf_counter() - began) * 1000:.1f}".encode()
                message["headers"] = [
                    *message.get("headers", ()),
                    *SECURITY_HEADERS,
                    (b"server-timing", spent),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


class SettledFirst:
    """Each console request sees every call answered before it: the calls' settlements, which the
    answers do not wait for (billing/ledger.py), are made durable first (a few milliseconds)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.gateway.ledger.settled_so_far()
        await self.app(scope, receive, send)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if "/api/" in request.url.path:
        return JSONResponse(
            {
                "error": {
                    "message": str(exc.detail),
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "not_found" if exc.status_code == 404 else "invalid_request",
                }
            },
            status_code=exc.status_code,
        )
    c = console_of(request)
    message = "There is no such page in the console." if exc.status_code == 404 else str(exc.detail)
    return c.render(
        request, "error.html", status=exc.status_code, title=str(exc.status_code), message=message
    )


def console_app(gateway: Gateway) -> Starlette:
    app = Starlette(
        routes=[
            Route("/static/{name}", static, methods=["GET"]),
            *pages.routes(),
            *api.routes(),
            *budgets_api.routes(),
        ],
        middleware=[Middleware(Headers), Middleware(SettledFirst, gateway=gateway)],
        exception_handlers={HTTPException: http_error},
    )
    app.state.console = Console(gateway)
    return app
