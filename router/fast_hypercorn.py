"""hypercorn's steps around each HTTP/1.1 request, the same in fewer steps (with
:mod:`router.fast_h11` and :mod:`router.fast_headers`, what the gateway's processes run).

For every request hypercorn's ``H11Protocol`` reads the request's headers twice, once to look for an
``h2c`` upgrade (``_check_protocol``) and once for a WebSocket upgrade (``_create_stream``), each
time decoding every name as latin-1, stripping and lower-casing it; and ``HTTPStream`` copies every
response header through ``bytes()`` twice before h11 checks it again (``build_and_validate_headers``).
h11 has given the names lower-case and checked (a token: nothing to strip) and the values without
surrounding whitespace, so:

- :func:`framing_headers` reads ``upgrade``, ``connection`` and whether a body is framed in one pass
  of byte comparisons; :func:`check_protocol` hands a request that may switch protocol (an ``h2c``
  upgrade without a body, ``PRI``) to hypercorn's own, which answers it, and has nothing to do for
  any other; :func:`create_stream` hands a WebSocket upgrade (hypercorn's own test, word for word) to
  hypercorn's own and opens the HTTP stream for the rest as hypercorn does.
- :func:`build_and_validate_headers` is hypercorn's, converting only what is not ``bytes`` already.

``tests/test_fast_hypercorn.py`` holds each equal to hypercorn's own on generated headers.
:func:`install` puts them where hypercorn looks them up; ``router.serve`` calls it.
"""

from __future__ import annotations

from typing import Any

import hypercorn.protocol.h11 as hypercorn_h11
import hypercorn.protocol.http_stream as hypercorn_http_stream
from hypercorn.protocol.events import Request
from hypercorn.protocol.http_stream import HTTPStream

H11Protocol = hypercorn_h11.H11Protocol
ORIGINAL_CHECK_PROTOCOL = H11Protocol._check_protocol
ORIGINAL_CREATE_STREAM = H11Protocol._create_stream
ORIGINAL_BUILD = hypercorn_http_stream.build_and_validate_headers
STREAM_ID = hypercorn_h11.STREAM_ID


def framing_headers(headers: Any) -> tuple[str, str, bool]:
    """(the last ``upgrade`` value, the last ``connection`` value, a ``content-length`` or
    ``transfer-encoding`` is there) of an h11 request's headers, as hypercorn reads them."""
    upgrade = connection = ""
    has_body = False
    for name, value in headers:
        if name == b"upgrade":
            upgrade = value.decode("latin1").strip()
        elif name == b"connection":
            connection = value.decode("latin1").strip()
        elif name == b"content-length" or name == b"transfer-encoding":
            has_body = True
    return upgrade, connection, has_body


def websocket(upgrade: str, connection: str, method: bytes) -> bool:
    """hypercorn's test for a WebSocket upgrade (``H11Protocol._create_stream``)."""
    return (
        any(token.strip() == "upgrade" for token in connection.lower().split(","))
        and upgrade.lower() == "websocket"
        and method.decode("ascii").upper() == "GET"
    )


async def check_protocol(self: Any, event: Any) -> None:
    upgrade, _, has_body = framing_headers(event.headers)
    if (upgrade.lower() == "h2c" and not has_body) or event.method == b"PRI":
        await ORIGINAL_CHECK_PROTOCOL(self, event)  # (it answers, or raises to switch protocol)


async def create_stream(self: Any, request: Any) -> None:
    upgrade, connection, _ = framing_headers(request.headers)
    if upgrade and websocket(upgrade, connection, request.method):
        await ORIGINAL_CREATE_STREAM(self, request)
        return
    self.stream = HTTPStream(self.app, self.config, self.context, self.task_group, self.ssl, self.client,
                             self.server, self.stream_send, STREAM_ID)  # fmt: skip
    headers = request.headers.raw_items() if self.config.h11_pass_raw_headers else list(request.headers)
    await self.stream.handle(
        Request(
            stream_id=STREAM_ID,
            headers=headers,
            http_version=request.http_version.decode(),
            method=request.method.decode("ascii").upper(),
            raw_path=request.target,
            state=self.connection_state,
        )
    )
    self.keep_alive_requests += 1
    await self.context.mark_request()


def build_and_validate_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name[0] == 58:  # b":"
            raise ValueError("Pseudo headers are not valid")
        out.append(((name if type(name) is bytes else bytes(name)).strip(),
                    (value if type(value) is bytes else bytes(value)).strip()))  # fmt: skip
    return out


def install() -> None:
    setattr(H11Protocol, "_check_protocol", check_protocol)  # noqa: B010
    setattr(H11Protocol, "_create_stream", create_stream)  # noqa: B010
    setattr(hypercorn_http_stream, "build_and_validate_headers", build_and_validate_headers)  # noqa: B010
