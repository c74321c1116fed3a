"""``Front``: the gateway's outermost ASGI layer, pure ASGI so streams and disconnects pass through
untouched.

Every HTTP request gets an id (the caller's ``x-request-id`` if it sent a sane one: short, plain
characters, no key of this gateway in it, core/redact.py), returned as the ``x-request-id`` response
header; it is counted in the metrics (core/metrics.py) and gets its access-log line (router/logs.py)
once the last byte is sent. SSE responses count as open streams while they are written.

The hot endpoints (``POST /v1/chat/completions``, ``POST /v1/responses``) are called from here
directly: Starlette's error middleware, exception middleware, router and request/response wrappers
would add five layers (and four ``send`` wrappers per stream chunk) to every call. Their errors are
rendered here the way the app's exception handlers render them. Every other request, and those two
paths with another method, go through the Starlette app.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request

from core import metrics
from core.errors import GatewayError
from core.redact import DEFAULT_KEY_PREFIX, holds_key, redact_keys
from core.types import ASGIApp, Message, Receive, Scope, Send, new_id
from router import logs

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})  # answered probes and scrapes are not access-logged

log = logging.getLogger("router")

ErrorApp = Callable[[Exception, Scope], ASGIApp]  # the response (an ASGI app) that answers an exception


def route_path(scope: Scope) -> str:
    """The path below the app's mount point (Starlette's rule: ``root_path`` is part of ``path``)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and len(path) > len(root) and path[len(root)] == "/":
        return path[len(root) :]
    return path


class Front:
    """Request id, metrics and access log of every request; the ``fast`` endpoints (route path →
    ASGI app answering POST) called straight, their exceptions answered by ``on_error``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access_log: bool = True,
        fast: Mapping[str, ASGIApp] | None = None,
        on_error: ErrorApp | None = None,
        drain_bytes: int = 8 * 1024 * 1024,
        drain_seconds: float = 30.0,
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self.app = app
        self.key_prefix = key_prefix  # the form of the gateway's keys: never taken as a request id or logged
        self.access_log = access_log
        self.fast = dict(fast or {})
        self.on_error = on_error
        self.drain_bytes = drain_bytes  # an error answered before the body was read: how much of it is
        self.drain_seconds = drain_seconds  # read first (see drain), and for how long

    async def drain(self, receive: Receive) -> bool:
        """Before an answer with the request's body unread (a bad key, a wrong content type: the endpoint
        refused before reading it; a model endpoint's error, or any route's answer), read the body and
        drop it, so that a caller still
        sending it gets the answer on a connection that goes on: HTTP/1.1 leaves the unread body in the
        way of the next request, and the server stopped reading, which left a caller sending a large
        body blocked until its timeout. False (the connection is then closed after the answer) past
        ``drain_bytes`` or ``drain_seconds``, or if the caller left."""
        try:
            return await asyncio.wait_for(_drained(receive, self.drain_bytes), self.drain_seconds)
        except (TimeoutError, OSError):  # (a caller gone is a False from _drained)
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        rid = b""
        for name, value in scope["headers"]:
            if (
                name == b"x-request-id"
                and _SANE.match(value)
                and not holds_key(value.decode(), self.key_prefix)
            ):
                rid = value
                break
        if not rid:
            rid = b"req_" + new_id().encode()
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        trace = state[logs.TRACE] = logs.Trace(rid.decode(), began, key_prefix=self.key_prefix)
        status = 0
        stream = False

        async def observe(message: Message) -> None:
            nonlocal status, stream
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.get("headers") or []
                close = False  # the body left unread and not drained: the connection closes after this
                if not trace.body_read and _CLOSE[0] not in headers and _has_body(scope):
                    trace.body_read = True
                    close = not await self.drain(receive)
                for name, value in headers:
                    if name == b"content-type":
                        if value.startswith(b"text/event-stream"):
                            stream = True
                            metrics.OPEN_STREAMS.inc()
                        break
                if 300 <= status < 400:
                    headers = _path_only(headers, scope)
                message["headers"] = [*headers, (b"x-request-id", rid), *(_CLOSE if close else ())]
            await send(message)

        path = route_path(scope)
        if path.startswith("/v1/") and path.endswith("/"):  # served as the path without it (_unslashed)
            path = _unslashed(scope)
        fast = self.fast.get(path) if scope["method"] == "POST" else None
        try:
            if fast is not None:
                try:
                    await fast(scope, receive, observe)
                except ClientDisconnect:
                    status = status or 499  # gone while sending its body: nobody to answer
                except Exception as exc:
                    if status or self.on_error is None:
                        raise  # the answer has begun: the server drops the connection
                    if not isinstance(exc, GatewayError):
                        log.exception("unhandled error on %s", redact_keys(path, self.key_prefix))
                    await self.on_error(exc, scope)(scope, receive, observe)
            else:  # (a fast route's body is read by router.chat.read_body, which says so in the trace)
                if _has_body(scope):

                    async def tracked() -> Message:  # the body read to its end (or the caller gone)
                        message = await receive()
                        if message["type"] != "http.request" or not message.get("more_body", False):
                            trace.body_read = True
                        return message

                    await self.app(scope, tracked, observe)
                else:
                    await self.app(scope, receive, observe)
        except asyncio.CancelledError:
            status = status or 499  # the caller went away before an answer
            raise
        except BaseException:
            status = status or 500
            raise
        finally:
            if stream:
                metrics.OPEN_STREAMS.dec()
            elapsed = time.perf_counter() - began
            endpoint = path if fast is not None else getattr(scope.get("route"), "path", "unmatched")
            metrics.request_done(endpoint, status, elapsed)
            quiet = status < 400 and endpoint in _PROBES
            if self.access_log and not quiet and logs.ACCESS.isEnabledFor(logging.INFO):
                logs.access(scope, status, elapsed, stream)


_CLOSE = ((b"connection", b"close"),)


def _unslashed(scope: Scope) -> str:
    """An API path with a trailing slash (``/v1/chat/completions/``) served as the path without it, so
    its key is checked as on the path itself, not redirected before (Starlette's redirect_slashes
    built ``Location: http://<Host>/...`` from the Host header): the route path it now has."""
    scope["path"] = scope["path"].rstrip("/")
    if isinstance(scope.get("raw_path"), bytes):
        scope["raw_path"] = scope["raw_path"].rstrip(b"/")
    return route_path(scope)


def _path_only(headers: list[tuple[bytes, bytes]], scope: Scope) -> list[tuple[bytes, bytes]]:
    """A redirect to this request's own Host (Starlette's to ``/console/`` from ``/console``) sent as a
    path: the browser resolves it against the URL it asked for, so no forwarded or forged Host header,
    and no ``http://`` behind TLS, gets into it."""
    host = next((value for name, value in scope["headers"] if name == b"host"), b"")
    kept = []
    for name, value in headers:
        if name == b"location" and host:
            for scheme in (b"http://", b"https://"):
                if value.startswith(scheme + host + b"/"):
                    value = b"/" + value[len(scheme + host) :].lstrip(b"/")  # (never "//elsewhere")
        kept.append((name, value))
    return kept


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if (name == b"content-length" and value != b"0") or name == b"transfer-encoding":
            return True
    return False


async def _drained(receive: Receive, most: int) -> bool:
    """Read the request's body to its end and drop it; False past ``most`` bytes or if the caller left."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        size += len(message.get("body", b""))
        if size > most:
            return False
        if not message.get("more_body", False):
            return True


CORS_EXPOSED = (
    "x-request-id",
    "retry-after",
    "retry-after-ms",
    "x-request-cost",
    "x-budget-window",
    "x-budget-reset",
    "x-router-omitted-tools",
    "x-router-token-count",
    *(
        f"x-ratelimit-{what}-{unit}"
        for what in ("limit", "remaining", "reset")
        for unit in ("requests", "tokens")
    ),
)


def cors(app: ASGIApp, origins: list[str]) -> ASGIApp:
    """``app`` answering CORS on ``/v1/*`` for ``origins`` (``*``: any), or ``app`` itself if none.
    Starlette's middleware is pure ASGI: it answers preflights and adds headers to the response start,
    and passes the body (streams included) through untouched. No credentials: keys go in a header."""
    if not origins:
        return app
    inner = CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=("GET", "POST", "DELETE"),
        allow_headers=("*",),  # the SDKs send their own (x-stainless-*, openai-*): mirror what is asked
        expose_headers=CORS_EXPOSED,
        max_age=600,
    )

    async def with_cors(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope).startswith("/v1/"):
            await inner(scope, receive, send)
        else:
            await app(scope, receive, send)

    return with_cors


def endpoint_app(handle: Callable[[Request], Awaitable[ASGIApp]]) -> ASGIApp:
    """An ASGI app of a ``handle(request) -> Response`` endpoint (what Starlette's ``Route`` does,
    without its exception wrapping: ``Front`` answers the exceptions)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handle(Request(scope, receive))
        await response(scope, receive, send)

    return app
