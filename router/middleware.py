"""Pure-ASGI middleware: streams and disconnects pass through untouched.

``RequestID`` gives every request an id (the caller's ``x-request-id`` if it sent a sane one) and
returns it as the ``x-request-id`` response header. ``Observe`` counts every request in the metrics
(router/metrics.py) and writes its access-log line (router/logs.py) once the last byte is sent.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from router import logs, metrics
from router.types import ASGIApp, Message, Receive, Scope, Send, new_id

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class RequestID:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = b""
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _SANE.match(value):
                rid = value
                break
        if not rid:
            rid = b"req_" + new_id().encode()
        scope.setdefault("state", {})["request_id"] = rid.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, receive, send_with_id)


_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})  # answered probes and scrapes are not access-logged


class Observe:
    """Metrics and the access log of each HTTP request; SSE responses count as open streams while they
    are written. The endpoint label is the matched route's template (``/v1/models/{model:path}``), or
    ``unmatched``, so a path never adds a series."""

    def __init__(self, app: ASGIApp, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 0
        stream = False

        async def observe(message: Message) -> None:
            nonlocal status, stream
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"content-type":
                        if value.startswith(b"text/event-stream"):
                            stream = True
                            metrics.OPEN_STREAMS.inc()
                        break
            await send(message)

        try:
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
            endpoint = getattr(scope.get("route"), "path", "unmatched")
            metrics.request_done(endpoint, status, elapsed)
            quiet = status < 400 and endpoint in _PROBES
            if self.access_log and not quiet and logs.ACCESS.isEnabledFor(logging.INFO):
                logs.access(scope, status, elapsed, stream)
