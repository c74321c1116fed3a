"""Pure-ASGI middleware: streams and disconnects pass through untouched.

``RequestID`` gives every request an id (the caller's ``x-request-id`` if it sent a sane one) and
returns it as the ``x-request-id`` response header.
"""

from __future__ import annotations

import re
import secrets

from router.types import ASGIApp, Message, Receive, Scope, Send

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
            rid = b"req_" + secrets.token_hex(12).encode()
        scope.setdefault("state", {})["request_id"] = rid.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, receive, send_with_id)
