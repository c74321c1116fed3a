"""HTTP/1.1 connections read by httptools: hypercorn's ``H11Protocol`` without h11, what the gateway's
processes run (hypercorn keeps the sockets, the HTTP/2 connections and each request's ASGI cycle).

hypercorn reads and writes HTTP/1.1 through h11, a state machine in pure Python: a request's head
and its answer came to about a quarter of the instructions of a call through the gateway, even after
:mod:`server.fast_headers` took h11's header checks down. :class:`HTTP1Protocol` has the same
constructor, the same three methods (``initiate``, ``handle``, ``stream_send``) and sends hypercorn
the same events, and hands each request to hypercorn's own ``HTTPStream`` as hypercorn does; what
changes is how the bytes are read and written:

- **Reading**: httptools (llhttp, the parser Node.js uses, in C) splits the request; its callbacks
  only collect, and the collected events are handled in order afterwards as h11's were. h11's rules
  that llhttp does not apply are applied here: ``Host`` required once in HTTP/1.1 (400), a
  ``Transfer-Encoding`` other than ``chunked`` refused with 501, a request head over
  ``h11_max_incomplete_size`` refused with 431, keep-alive only for HTTP/1.1 without
  ``Connection: close``, header values without surrounding whitespace, names lower-cased, trailers
  dropped, ``100 Continue`` sent after a head that expects it. A request that arrives while the last
  one is still being answered (pipelining) waits for it, as h11's pause does.
- **Writing**: the head of an answer is h11's bytes for it (``HTTP/1.1 200 \\r\\n``, the headers as
  given, h11's framing: ``Transfer-Encoding: chunked`` when no length is given, ``Connection: close``
  when the connection will close); a head with a ``Content-Length`` is held and written with the
  first part of the body, so an answer is one ``write`` (one ``send`` system call) instead of three.
  h11's errors stay h11's: ``LocalProtocolError`` for a body longer or shorter than its length.
- **Switching**: the HTTP/2 preface (``PRI * HTTP/2.0``) and an ``h2c`` upgrade without a body raise
  hypercorn's own ``H2ProtocolAssumedError`` / ``H2CProtocolRequiredError``, and hypercorn's
  ``ProtocolWrapper`` moves the connection to HTTP/2 as before.

Where llhttp is stricter than h11, the request is refused with 400 where h11 accepted it: obsolete
line folding in a header, two equal ``Content-Length`` headers, ``Content-Length`` together with
``Transfer-Encoding``, an HTTP version other than 1.0, 1.1 and 2.0, a method llhttp does not know.
An ``Upgrade`` to anything but ``h2c`` (a WebSocket, which the gateway does not serve) is answered as
the plain request it also is, and an ``h2c`` upgrade is taken only with ``Connection: Upgrade``, as
RFC 7540 requires of the client. ``tests/test_fast_http1.py`` runs this protocol and hypercorn's
``H11Protocol`` on stock h11 side by side on generated requests, split at generated points, with
answers of every framing, and holds the bytes written, the events sent and the errors equal.
And :func:`build_and_validate_headers` is hypercorn's copy of an answer's headers without the copy
of what is ``bytes`` already. :func:`install` puts both where hypercorn looks them up;
``server.serve`` calls it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from itertools import chain
from types import SimpleNamespace
from typing import Any

import httptools
import hypercorn.protocol as hypercorn_protocol
import hypercorn.protocol.http_stream as hypercorn_http_stream
from h11 import LocalProtocolError
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.events import (
    Body,
    Data,
    EndBody,
    Request,
    Response,
    StreamClosed,
)
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H2ProtocolAssumedError
from hypercorn.protocol.http_stream import HTTPStream

from server.fast_headers import (
    KNOWN_NAMES,
    MAX_LENGTH_DIGITS,
    field_value_ok,
    normalize_and_validate,
    valid_name,
)

ORIGINAL = hypercorn_protocol.H11Protocol
ORIGINAL_BUILD = hypercorn_http_stream.build_and_validate_headers
STREAM_ID = 1
PREFACE = b"PRI * HTTP/2.0\r\n\r\n"
_HEAD, _BODY, _END, _ERROR, _UPGRADE, _PREFACE = range(6)  # what the parser's callbacks collect
_LENGTH, _CHUNKED, _UNTIL_CLOSE = range(3)  # how an answer's body is framed (h11's three)
_WS = (32, 9)  # a space, a tab
_NO_HEADERS: list[tuple[bytes, bytes]] = []  # between heads (never appended to: on_header checks _in_head)
_REPAIRED = frozenset((b"transfer-encoding", b"connection", b"host"))  # answer headers left to h11's rules
_SPECIAL_LENGTHS = frozenset(
    len(name)
    for name in (b"host", b"transfer-encoding", b"content-length", b"connection", b"upgrade", b"expect")
)


def _comma_tokens(value: bytes) -> list[bytes]:
    """A comma-separated header value's tokens, lower case (h11's ``get_comma_header`` for one line)."""
    return [token for token in (t.strip() for t in value.lower().split(b",")) if token]


def _tokens(items: list[tuple[bytes, bytes, bytes]], name: bytes) -> list[bytes]:
    """h11's ``get_comma_header`` over checked (name, lower-case name, value) items."""
    out = []
    for _, lower, value in items:
        if lower == name:
            out += _comma_tokens(value)
    return out


def response_head(
    status: int, headers: list[tuple[bytes, bytes]], method: bytes, version: bytes | None, keep_alive: bool
) -> tuple[bytes, int, int, bool]:
    """h11's bytes for an answer's head (``Connection.send(Response(...))``) to a request of
    ``method`` and HTTP ``version`` (None: no request was read), with the connection's keep-alive as
    it stood: (the head, the body's framing, its length when framed by one, whether the connection
    stays open after). Raises h11's ``LocalProtocolError`` for headers h11 refuses."""
    if not 200 <= status < 1000:
        raise LocalProtocolError(f"Response status_code should be in range [200, 1000), not {status}")
    lines: list[bytes] = [b"HTTP/1.1 %d \r\n" % status]
    length = -1
    plain = keep_alive
    known = KNOWN_NAMES.get
    for name, value in headers:  # the common answer: checked names, a length, no framing to repair
        lower = known(name)  # (valid_name and valid_value inline: this runs for every answer)
        if lower is None and (type(name) is not bytes or (lower := valid_name(name)) is None):
            plain = False
            break
        if lower in _REPAIRED or type(value) is not bytes or not (value.isalnum() or field_value_ok(value)):
            plain = False
            break
        if lower == b"content-length":
            if length >= 0 or not value.isdigit() or len(value) > MAX_LENGTH_DIGITS:
                plain = False
                break
            length = int(value)
        lines += (name, b": ", value, b"\r\n")
    if plain and length >= 0 and status not in (204, 304) and method != b"CONNECT":
        lines.append(b"\r\n")
        return b"".join(lines), _LENGTH, (0 if method == b"HEAD" else length), True
    return _general_head(status, headers, method, version, keep_alive)


def _general_head(
    status: int, headers: list[tuple[bytes, bytes]], method: bytes, version: bytes | None, keep_alive: bool
) -> tuple[bytes, int, int, bool]:
    """:func:`response_head` for any headers: h11's ``_clean_up_response_headers_for_sending`` and
    ``_body_framing`` step by step."""
    items = normalize_and_validate(headers)._full_items
    empty = status in (204, 304)
    chosen = b"GET" if method == b"HEAD" else method
    need_close = False
    if not (empty or (chosen == b"CONNECT" and 200 <= status < 300)) and (
        _tokens(items, b"transfer-encoding") or not _tokens(items, b"content-length")
    ):  # a body of unknown length: chunked for HTTP/1.1, else until the connection closes
        items = [item for item in items if item[1] != b"content-length" and item[1] != b"transfer-encoding"]
        if version is None or version < b"1.1":
            need_close = method != b"HEAD"
        else:
            items += normalize_and_validate([(b"Transfer-Encoding", b"chunked")])._full_items
    if not keep_alive or need_close:
        connection = set(_tokens(items, b"connection"))
        connection.discard(b"keep-alive")
        connection.add(b"close")
        items = [item for item in items if item[1] != b"connection"]
        items += normalize_and_validate([(b"Connection", token) for token in sorted(connection)])._full_items
    keeps = keep_alive and b"close" not in _tokens(items, b"connection")
    if empty or method == b"HEAD" or (method == b"CONNECT" and 200 <= status < 300):
        framing, length = _LENGTH, 0
    elif _tokens(items, b"transfer-encoding"):
        framing, length = _CHUNKED, 0
    elif lengths := _tokens(items, b"content-length"):
        framing, length = _LENGTH, int(lengths[0])
    else:
        framing, length = _UNTIL_CLOSE, 0
    return _head(status, items), framing, length, keeps


def informational_head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """h11's bytes for an ``InformationalResponse`` (``100 Continue``, ``101`` to HTTP/2)."""
    if not 100 <= status < 200:
        raise LocalProtocolError(
            f"InformationalResponse status_code should be in range [100, 200), not {status}"
        )
    return _head(status, normalize_and_validate(headers)._full_items)


def _head(status: int, items: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """h11's ``write_any_response``: the status line without a reason, Host first, then the rest."""
    lines = [b"HTTP/1.1 %d \r\n" % status]
    lines += [b"%s: %s\r\n" % (raw, value) for raw, lower, value in items if lower == b"host"]
    lines += [b"%s: %s\r\n" % (raw, value) for raw, lower, value in items if lower != b"host"]
    lines.append(b"\r\n")
    return b"".join(lines)


def _new_parser(protocol: HTTP1Protocol) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)  # a bare LF ends a line, as in h11
    return parser


class HTTP1Protocol:
    """One HTTP/1.1 connection: hypercorn's ``H11Protocol`` on httptools (the module's docstring)."""

    __slots__ = (
        "app",
        "config",
        "context",
        "task_group",
        "connection_state",
        "ssl",
        "client",
        "server",
        "send",
        "can_read",
        "stream",
        "keep_alive_requests",
        "parser",
        "_events",
        "_broken",
        "_closed",
        "_between",
        "_prefix",
        "_in_head",
        "_head_bytes",
        "_url",
        "_headers",
        "_method",
        "_version",
        "_keep_alive",
        "_received",
        "_answer",
        "_failed",
        "_framing",
        "_left",
        "_held",
    )  # (an open stream's memory)

    def __init__(
        self,
        app: Any,
        config: Any,
        context: Any,
        task_group: Any,
        connection_state: Any,
        ssl: bool,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.task_group = task_group
        self.connection_state = connection_state
        self.ssl = ssl
        self.client = client
        self.server = server
        self.send = send
        self.can_read = context.event_class()
        self.stream: HTTPStream | None = None
        self.keep_alive_requests = 0
        self.parser = _new_parser(self)
        self._events: list[tuple[Any, ...]] = []  # collected by the parser, not handled yet
        self._broken = False  # the parser met an error: nothing more is read
        self._closed = False  # Closed was sent: nothing more is read or answered
        self._between = True  # between two requests (where the HTTP/2 preface may come)
        self._prefix = b""  # a read that may be the start of the HTTP/2 preface
        self._in_head = False
        self._head_bytes = 0  # read while the current request head is incomplete
        self._url = b""
        self._headers = _NO_HEADERS
        self._cycle()

    def _cycle(self) -> None:
        """A new request/answer cycle (h11's ``start_next_cycle``)."""
        self._method = b""
        self._version: bytes | None = None
        self._keep_alive = True
        self._received = False  # the request's end was read
        self._answer = 0  # 0: no head sent; 1: head sent, body under way; 2: answer complete
        self._failed = False  # a LocalProtocolError was raised: the connection closes
        self._framing = _LENGTH
        self._left = 0  # what the answer's Content-Length still allows
        self._held = b""  # the answer's head, written with its first body bytes

    async def initiate(self) -> None:
        pass

    # the parser's callbacks: collect, in order

    def on_message_begin(self) -> None:
        self._between = False
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # (not a trailer)
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self.parser
        self._events.append((_HEAD, self._url, self._headers, parser.get_method(), parser.get_http_version()))
        self._url = b""
        self._headers = _NO_HEADERS  # (not kept for as long as the answer takes)

    def on_body(self, body: bytes) -> None:
        self._events.append((_BODY, body))

    def on_message_complete(self) -> None:
        self._events.append((_END,))
        self._between = True

    # reading

    async def handle(self, event: Any) -> None:
        if type(event) is RawData:
            if not self._closed and not self._broken:
                self._read(event.data)
                await self._handle_events()
        elif isinstance(event, Closed):
            if self.stream is not None:
                await self._close_stream()

    def _read(self, data: bytes) -> None:
        if self._between and (self._prefix or data[:1] == b"P"):
            data = self._prefix + data
            self._prefix = b""
            if data.startswith(PREFACE):
                self._broken = True  # (this connection is HTTP/2's from here)
                self._events.append((_PREFACE, data))
                return
            if PREFACE.startswith(data):
                self._prefix = data  # (wait for the rest of it)
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._events.append((_UPGRADE, data[upgrade.args[0] :]))
        except httptools.HttpParserError:
            self._broken = True
            self._events.append((_ERROR, 400))
        else:
            if self._in_head:
                self._head_bytes += len(data)
                if self._head_bytes > self.config.h11_max_incomplete_size:
                    self._broken = True
                    self._events.append((_ERROR, 431))

    async def _handle_events(self) -> None:
        events = self._events
        while events and not self._closed:
            event = events.pop(0)
            kind = event[0]
            if kind is _BODY:
                if self.stream is not None:
                    await self.stream.handle(Body(stream_id=STREAM_ID, data=event[1]))
            elif kind is _END:
                self._received = True
                if self.stream is not None:
                    await self.stream.handle(EndBody(stream_id=STREAM_ID))
            elif self._received and not await self._next_cycle():
                return  # (the connection closed after the last answer)
            elif kind is _HEAD:
                await self._request(event[1], event[2], event[3], event[4].encode("ascii"))
            elif kind is _UPGRADE:  # a plain request after all (h2c is taken at its head): read on
                self.parser = _new_parser(self)
                if event[1]:
                    self._read(event[1])
            elif kind is _PREFACE:  # as hypercorn meets it: a request, that switches protocol
                await self.send(Updated(idle=False))
                raise H2ProtocolAssumedError(event[1])
            else:
                await self._refuse(event[1])

    async def _next_cycle(self) -> bool:
        """Wait until the last request has been answered (h11 pauses while a request's end has been
        read and its cycle is not over); False if the connection closed instead."""
        await self.can_read.clear()
        await self.can_read.wait()
        return not self._closed

    async def _request(
        self, url: bytes, raw: list[tuple[bytes, bytes]], method: bytes, version: bytes
    ) -> None:
        headers = []
        hosts = chunked = 0
        framed = expect = close = False
        upgrade = b""
        known = KNOWN_NAMES.get
        for name, value in raw:
            lower = known(name) or valid_name(name) or name.lower()  # (llhttp checked it a token)
            if value and (value[-1] in _WS or value[0] in _WS):
                value = value.strip(b" \t")
            if len(lower) in _SPECIAL_LENGTHS:
                if lower == b"host":
                    hosts += 1
                elif lower == b"transfer-encoding":
                    framed = True
                    if value.lower() == b"chunked":
                        chunked += 1
                        value = b"chunked"  # (as h11 gives it)
                    else:
                        chunked = 2
                elif lower == b"content-length":
                    framed = True
                elif lower == b"connection":
                    close = close or b"close" in _comma_tokens(value)
                elif lower == b"upgrade":
                    upgrade = value
                elif lower == b"expect":
                    expect = expect or b"100-continue" in _comma_tokens(value)
            headers.append((name if self.config.h11_pass_raw_headers else lower, value))
        if chunked > 1:  # h11: only one Transfer-Encoding, and only chunked
            await self._refuse(501)
            return
        if hosts > 1 or (hosts == 0 and version == b"1.1"):  # h11: Host once in HTTP/1.1, at most once
            await self._refuse(400)
            return
        self._method = method
        self._version = version
        self._keep_alive = version >= b"1.1" and not close
        await self.send(Updated(idle=False))
        if (
            upgrade.strip().lower() == b"h2c"
            and not framed
            and self._events[-1:]
            and self._events[-1][0] is _UPGRADE
        ):
            await self._write(
                informational_head(
                    101,
                    self.config.response_headers("h11") + [(b"connection", b"upgrade"), (b"upgrade", b"h2c")],
                )
            )
            request = SimpleNamespace(method=method, target=url, headers=headers)
            raise H2CProtocolRequiredError(self._events[-1][1], request)  # type: ignore[arg-type]
        self.stream = HTTPStream(
            self.app,
            self.config,
            self.context,
            self.task_group,
            self.ssl,
            self.client,
            self.server,
            self.stream_send,
            STREAM_ID,
        )
        await self.stream.handle(
            Request(
                stream_id=STREAM_ID,
                headers=headers,
                http_version=version.decode(),
                method=method.decode("ascii").upper(),
                raw_path=url,
                state=self.connection_state,
            )
        )
        self.keep_alive_requests += 1
        await self.context.mark_request()
        if expect and version >= b"1.1" and not self._answer:
            await self._write(informational_head(100, self.config.response_headers("h11")))

    async def _refuse(self, status: int) -> None:
        """h11's RemoteProtocolError in hypercorn: an error answer if none was begun, and close."""
        self._broken = True
        if not self._answer:
            headers = [
                (b"content-length", b"0"),
                (b"connection", b"close"),
                *self.config.response_headers("h11"),
            ]
            head = response_head(status, headers, self._method, self._version, self._keep_alive)[0]
            await self._write(head)
        self._closed = True
        await self.send(Closed())

    # writing

    async def stream_send(self, event: Any) -> None:
        kind = type(event)
        if kind is Body:
            await self._body(event.data)
        elif kind is Response:
            await self._respond(event)
        elif kind is EndBody:
            await self._end()
        elif kind is StreamClosed:
            await self._maybe_recycle()
        elif kind is Data:  # (passed through, as hypercorn does)
            await self.send(RawData(data=event.data))
        # (InformationalResponse and EndData: nothing for HTTP/1, as in hypercorn)

    async def _write(self, data: bytes) -> None:
        if self._held:
            data = self._held + data
            self._held = b""
        if data:
            await self.send(RawData(data=data))

    async def _fail(self, message: str) -> None:
        """h11's LocalProtocolError: the connection closes after; a held head is written first (h11
        had written it)."""
        self._failed = True
        await self._write(b"")
        raise LocalProtocolError(message)

    async def _respond(self, event: Response) -> None:
        status = event.status_code
        headers = list(chain(event.headers, self.config.response_headers("h11")))
        if status < 200:
            await self._write(informational_head(status, headers))
            return
        if self._answer:
            await self._fail("Can't send Response in state SEND_BODY")
        if self.keep_alive_requests >= self.config.keep_alive_max_requests:
            headers.append((b"connection", b"close"))
        try:
            head, self._framing, self._left, self._keep_alive = response_head(
                status, headers, self._method, self._version, self._keep_alive
            )
        except LocalProtocolError:
            self._failed = True
            raise
        self._answer = 1
        if self._framing is _LENGTH:
            self._held = head  # written with the body
        else:
            await self._write(head)

    async def _body(self, data: bytes) -> None:
        if self._answer != 1:
            await self._fail("Can't send data when our state is not SEND_BODY")
        framing = self._framing
        if framing is _LENGTH:
            self._left -= len(data)
            if self._left < 0:
                await self._fail("Too much data for declared Content-Length")
        elif framing is _CHUNKED and data:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        await self._write(data)

    async def _end(self) -> None:
        if self._answer != 1:
            await self._fail("Can't send EndOfMessage when our state is not SEND_BODY")
        if self._framing is _LENGTH and self._left:
            await self._fail("Too little data for declared Content-Length")
        self._answer = 2
        await self._write(b"0\r\n\r\n" if self._framing is _CHUNKED else b"")

    async def _maybe_recycle(self) -> None:
        await self._close_stream()
        if (
            not self.context.terminated.is_set()
            and self._answer == 2
            and self._received
            and self._keep_alive
            and not self._failed
            and not self._broken
        ):
            self._cycle()
            await self.can_read.set()
            await self.send(Updated(idle=True))
        else:
            self._closed = True
            await self._write(b"")  # (a held head: h11 had written it)
            await self.can_read.set()
            await self.send(Closed())

    async def _close_stream(self) -> None:
        if self.stream is not None:
            await self.stream.handle(StreamClosed(stream_id=STREAM_ID))
            self.stream = None


def build_and_validate_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """hypercorn's copy of an answer's headers (``http_stream.build_and_validate_headers``: every name
    and value through ``bytes()`` and ``strip()``), converting only what is not ``bytes`` already."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name[0] == 58:  # b":"
            raise ValueError("Pseudo headers are not valid")
        out.append(
            (
                (name if type(name) is bytes else bytes(name)).strip(),
                (value if type(value) is bytes else bytes(value)).strip(),
            )
        )
    return out


def install() -> None:
    setattr(hypercorn_protocol, "H11Protocol", HTTP1Protocol)  # noqa: B010  (ProtocolWrapper looks it up here)
    setattr(hypercorn_http_stream, "build_and_validate_headers", build_and_validate_headers)  # noqa: B010
