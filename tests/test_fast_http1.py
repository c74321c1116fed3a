"""server/fast_http1.py against hypercorn's own HTTP/1.1 protocol on h11: both run side by side on the
same generated requests (valid and not, pipelined, split at generated points) and answer through the
same app with every framing h11 knows; the bytes written, the events sent to the connection and the
errors raised must be equal. Where llhttp is stricter than h11 (the module's docstring), ours must
answer 400 and close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H2ProtocolAssumedError
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from server import fast_http1

DATE = (b"date", b"Thu, 26 Nov 2026 06:00:00 GMT")


class _Config(Config):
    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        return [DATE]


async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
    """Answers with what it was asked, framed as the path says."""
    path = scope["path"]
    body = b""
    if path != "/early":  # (answers before reading the body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message["body"]
            if not message["more_body"]:
                break
    seen = json.dumps(
        [
            scope["method"],
            scope["path"],
            scope["query_string"].decode(),
            scope["http_version"],
            [[n.decode(), v.decode("latin-1")] for n, v in scope["headers"]],
            body.decode("latin-1"),
        ]
    ).encode()
    headers = [(b"content-type", b"application/json")]
    status, parts = 200, [seen]
    if path == "/chunked":  # no length: chunked for HTTP/1.1, until close for HTTP/1.0
        parts = [seen[:10], b"", seen[10:]]
    elif path == "/empty":
        status, parts = 204, []
    elif path == "/not-modified":
        status, parts = 304, []
    elif path == "/close":
        headers.append((b"connection", b"close"))
    elif path == "/te":  # the app frames it itself, and gives a length too (h11 keeps the chunked)
        headers += [(b"transfer-encoding", b"chunked"), (b"content-length", b"5")]
    elif path == "/named":  # names as an app may give them, a Host among them (h11 writes it first)
        headers += [(b"X-Upper", b"Some Value"), (b"host", b"h"), (b"x-empty", b"")]
    elif path == "/too-long":
        headers.append((b"content-length", b"3"))
    elif path == "/too-short":
        headers.append((b"content-length", str(len(seen) + 5).encode()))
    elif path == "/bad-header":
        headers.append((b"x-bad", b"a\r\nb"))
    if path not in ("/chunked", "/te", "/too-long", "/too-short", "/empty", "/not-modified"):
        headers.append((b"content-length", str(len(seen)).encode()))
    if path == "/empty":
        headers = [(b"x-a", b"1")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for index, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": index < len(parts) - 1})
    if not parts:
        await send({"type": "http.response.body", "body": b""})


async def settle() -> None:
    for _ in range(60):
        await asyncio.sleep(0)


async def run(protocol_class: Any, chunks: list[bytes], max_requests: int = 1000) -> list[Any]:
    """What a connection of ``protocol_class`` sends given ``chunks`` then the end: its bytes (joined
    between events), its Closed and Updated events, and what it raised."""
    trace: list[Any] = []

    async def send(event: Any) -> None:
        if isinstance(event, RawData):
            if trace and trace[-1][0] == "bytes":
                trace[-1] = ("bytes", trace[-1][1] + event.data)
            else:
                trace.append(("bytes", event.data))
        elif isinstance(event, Closed):
            if not trace or trace[-1] != (
                "closed",
            ):  # (hypercorn's may close twice: the second does nothing)
                trace.append(("closed",))
        elif isinstance(event, Updated):
            trace.append(("idle", event.idle))

    config = _Config()
    config.keep_alive_max_requests = max_requests
    config.h11_max_incomplete_size = 1024
    context = WorkerContext(None)
    task_group = TaskGroup(asyncio.get_running_loop())
    async with task_group:
        protocol = protocol_class(
            ASGIWrapper(app),
            config,
            context,
            task_group,
            {},
            False,
            ("127.0.0.1", 5000),
            ("127.0.0.1", 8000),
            send,
        )
        await protocol.initiate()
        for chunk in chunks:
            if trace and trace[-1] == ("closed",):
                break
            try:
                await asyncio.wait_for(protocol.handle(RawData(chunk)), 5)
            except (H2ProtocolAssumedError, H2CProtocolRequiredError) as switch:
                trace.append(
                    (
                        "switch",
                        type(switch).__name__,
                        switch.data,
                        getattr(switch, "headers", None),
                        getattr(switch, "settings", None),
                    )
                )
                break
            except Exception as exc:  # noqa: BLE001 - the error is the answer compared
                trace.append(("raised", type(exc).__name__, str(exc)))
                break
            await settle()
        await protocol.handle(Closed())
        await settle()
    return trace


def both(chunks: list[bytes], max_requests: int = 1000) -> tuple[list[Any], list[Any]]:
    async def go() -> tuple[list[Any], list[Any]]:
        return (
            await run(fast_http1.ORIGINAL, chunks, max_requests),
            await run(fast_http1.HTTP1Protocol, chunks, max_requests),
        )

    return asyncio.run(go())


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


_PATHS = [
    "/len",
    "/chunked",
    "/empty",
    "/not-modified",
    "/close",
    "/te",
    "/named",
    "/early",
    "/len?q=1&r=%20",
]


@st.composite
def requests(draw: Any) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS"]))
    path = draw(st.sampled_from(_PATHS)).encode()
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    body = draw(st.sampled_from([b"", b"hello", b"x" * 300]))
    headers = [] if version == b"1.0" and draw(st.booleans()) else [(b"Host", b"example")]
    framing = draw(st.sampled_from(["length", "chunked", "none"])) if body or method == b"POST" else "none"
    if framing == "length":
        headers.append((b"Content-Length", str(len(body)).encode()))
    elif framing == "chunked":
        headers.append((b"Transfer-Encoding", draw(st.sampled_from([b"chunked", b"Chunked"]))))
        pieces = [body[:3], body[3:]] if body else []
        body = b"".join(
            b"%x%s\r\n%s\r\n" % (len(p), b";ext=1" if i else b"", p) for i, p in enumerate(pieces) if p
        )
        body += draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nX-Trailer: t\r\n\r\n"]))
    else:
        body = b""
    extra = draw(
        st.lists(
            st.sampled_from(
                [
                    (b"Connection", b"close"),
                    (b"Connection", b"keep-alive"),
                    (b"Expect", b"100-continue"),
                    (b"X-Pad", b"  padded \t"),
                    (b"User-Agent", b"t/1"),
                    (b"Accept", b"*/*"),
                    (b"X-Mixed-Case", b"V"),
                    (b"Connection", b"Keep-Alive, Foo"),
                ]
            ),
            max_size=4,
            unique=True,
        )
    )
    order = draw(st.permutations(headers + extra))
    head = b"%s %s HTTP/%s\r\n%s\r\n" % (
        method,
        path,
        version,
        b"".join(b"%s: %s\r\n" % pair for pair in order),
    )
    return head + body


@settings(max_examples=250, deadline=None)
@given(st.lists(requests(), min_size=1, max_size=3), st.lists(st.integers(0, 4000), max_size=6))
def test_valid_requests_get_the_same_bytes(pipelined: list[bytes], cuts: list[int]) -> None:
    # (h11 answers a request after which the connection closes with 400 when more follows it: the
    # test after this one shows ours answers it; here only the last request may close)
    assume(
        all(
            b"HTTP/1.1\r\n" in r and b"Connection: close" not in r and b"/close" not in r
            for r in pipelined[:-1]
        )
    )
    data = b"".join(pipelined)
    theirs, ours = both(split(data, cuts))
    assert ours == theirs
    assert theirs and theirs[0] == ("idle", False)


@pytest.mark.parametrize(
    "first", [b"GET /len HTTP/1.0\r\n\r\n", b"GET /len HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"]
)
def test_what_follows_a_request_that_closes_is_not_read(first: bytes) -> None:
    theirs, ours = both([first + b"GET /len HTTP/1.1\r\nHost: a\r\n\r\n"])
    assert theirs[1][1].startswith(b"HTTP/1.1 400 ")  # h11: "Got data when expecting EOF"
    assert [item[0] for item in ours] == ["idle", "bytes", "closed"] and ours[1][1].startswith(
        b"HTTP/1.1 200 "
    )
    assert ours[1][1].count(b"HTTP/1.1") == 1


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(["/too-long", "/too-short", "/bad-header", "/named", "/te", "/chunked"]),
    st.sampled_from([b"1.1", b"1.0"]),
    st.sampled_from([b"GET", b"HEAD"]),
    st.integers(1, 3),
)
def test_answers_h11_refuses_or_repairs_are_treated_alike(
    path: str, version: bytes, method: bytes, max_requests: int
) -> None:
    request = b"%s %s HTTP/%s\r\nHost: h\r\n\r\n" % (method, path.encode(), version)
    theirs, ours = both([request * (2 if version == b"1.1" else 1)], max_requests)
    assert ours == theirs


BAD = [
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",  # two
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nxx",  # 501
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",  # 501
    b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: \x00\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
    b"GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX-Long: " + b"a" * 3000,  # a head over the limit, never ending: 431
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n\r\n",  # the second has no Host
    b"POST /len HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nab",  # cut short
]


@pytest.mark.parametrize("data", BAD)
@pytest.mark.parametrize("piece", [0, 7, 100])
def test_bad_requests_get_the_same_answer(data: bytes, piece: int) -> None:
    chunks = [data] if not piece else [data[i : i + piece] for i in range(0, len(data), piece)]
    theirs, ours = both(chunks)
    assert ours == theirs


STRICTER = [
    b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",  # obsolete line folding
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
    b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n",  # a control character in a value
]


@pytest.mark.parametrize("data", STRICTER)
def test_what_llhttp_refuses_is_a_400_and_a_close(data: bytes) -> None:
    _, ours = both([data])
    assert ours == [
        ("bytes", b"HTTP/1.1 400 \r\ncontent-length: 0\r\nconnection: close\r\ndate: %s\r\n\r\n" % DATE[1]),
        ("closed",),
    ]


def test_blank_lines_before_a_request_are_read_past() -> None:
    """RFC 9112 2.2: a server SHOULD ignore at least one empty line before a request (h11 refused two)."""
    _, ours = both([b"\r\n\r\nGET /len HTTP/1.1\r\nHost: a\r\n\r\n"])
    assert ours[1][1].startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("piece", [0, 5])
def test_the_http2_preface_switches_alike(piece: int) -> None:
    data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04"
    chunks = [data] if not piece else [data[i : i + piece] for i in range(0, len(data), piece)]
    theirs, ours = both(chunks)
    assert ours == theirs
    assert ours[-1][:2] == ("switch", "H2ProtocolAssumedError")


def test_an_h2c_upgrade_switches_alike() -> None:
    data = (
        b"GET /len HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    )
    theirs, ours = both([data])
    assert ours == theirs
    assert ours[1][1].startswith(b"HTTP/1.1 101 ")
    assert ours[2][:2] == ("switch", "H2CProtocolRequiredError")


@pytest.mark.parametrize("upgrade", [b"Connection: Upgrade\r\nUpgrade: websocket", b"Upgrade: h2c"])
def test_other_upgrades_are_answered_as_plain_requests(upgrade: bytes) -> None:
    """A WebSocket (the gateway serves none), and h2c without ``Connection: Upgrade`` (hypercorn
    switched on it): each answered, and the connection read on."""
    data = b"GET /len HTTP/1.1\r\nHost: a\r\n%s\r\n\r\nGET /len HTTP/1.1\r\nHost: a\r\n\r\n" % upgrade
    _, ours = both([data])
    answers = [item for item in ours if item[0] == "bytes"]
    assert len(answers) == 2 and all(a[1].startswith(b"HTTP/1.1 200 ") for a in answers)
    assert b'"upgrade", "' in answers[0][1]


def test_an_answer_is_one_write() -> None:
    """The head of an answer with a length goes out with its body: one send, not three."""
    writes: list[bytes] = []

    async def go() -> None:
        async def send(event: Any) -> None:
            if isinstance(event, RawData):
                writes.append(event.data)

        task_group = TaskGroup(asyncio.get_running_loop())
        async with task_group:
            protocol = fast_http1.HTTP1Protocol(
                ASGIWrapper(app), _Config(), WorkerContext(None), task_group, {}, False, None, None, send
            )
            await protocol.handle(RawData(b"POST /len HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"))
            await settle()
            await protocol.handle(Closed())

    asyncio.run(go())
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 \r\n") and writes[0].endswith(b'"hi"]')


_raw = st.one_of(
    st.binary(max_size=6),
    st.builds(bytearray, st.binary(max_size=6)),
    st.sampled_from([b" a ", b":path", b"", b"x-y"]),
)


@settings(max_examples=500, deadline=None)
@given(headers=st.lists(st.tuples(_raw, _raw), max_size=5))
def test_the_answer_headers_copy_is_hypercorns(headers: list[tuple[Any, Any]]) -> None:
    def outcome(build: Any) -> Any:
        try:
            return build(headers)
        except (ValueError, IndexError) as exc:
            return type(exc)

    assert outcome(fast_http1.build_and_validate_headers) == outcome(fast_http1.ORIGINAL_BUILD)


def test_install_puts_them_where_hypercorn_looks() -> None:
    import hypercorn.protocol as protocol
    import hypercorn.protocol.http_stream as http_stream

    fast_http1.install()
    assert protocol.H11Protocol is fast_http1.HTTP1Protocol
    assert http_stream.build_and_validate_headers is fast_http1.build_and_validate_headers


_answer_headers = st.lists(
    st.sampled_from(
        [
            (b"content-type", b"application/json"),
            (b"content-length", b"5"),
            (b"Content-Length", b"5"),
            (b"content-length", b"x"),
            (b"content-length", b"7"),
            (b"transfer-encoding", b"chunked"),
            (b"Transfer-Encoding", b"gzip"),
            (b"connection", b"close"),
            (b"connection", b"keep-alive, Foo"),
            (b"host", b"h"),
            (b"x-request-id", b"req_1"),
            (b"x-bad", b"a\x00b"),
            (b"bad name", b"v"),
            (b"x-e", b""),
            (b"date", b"Thu, 26 Nov 2026 06:00:00 GMT"),
        ]
    ),
    max_size=5,
)


@settings(max_examples=3000, derandomize=True)
@given(
    st.sampled_from([200, 204, 304, 404, 199, 1000]),
    _answer_headers,
    st.sampled_from([b"GET", b"HEAD", b"POST", b"CONNECT"]),
    st.sampled_from([b"1.1", b"1.0"]),
    st.booleans(),
)
def test_an_answers_head_is_h11s(
    status: int, headers: list[tuple[bytes, bytes]], method: bytes, version: bytes, close: bool
) -> None:
    """response_head against an h11 connection that read the same request and sends the same answer:
    the same bytes, framing and keep-alive, or an error from both. (A 2xx to CONNECT switches h11 to
    a tunnel: the gateway routes no CONNECT, so none is answered 2xx.)"""
    import h11

    assume(not (method == b"CONNECT" and 200 <= status < 300))

    connection = h11.Connection(h11.SERVER)
    target = b"a:443" if method == b"CONNECT" else b"/"
    connection.receive_data(
        b"%s %s HTTP/%s\r\nHost: a\r\n%s\r\n"
        % (method, target, version, b"Connection: close\r\n" if close else b"")
    )
    assert type(connection.next_event()) is h11.Request
    try:
        theirs: Any = connection.send(h11.Response(status_code=status, headers=headers))
    except h11.LocalProtocolError:
        theirs = "refused"
    else:
        writer = connection._writer
        framing = {"ContentLengthWriter": fast_http1._LENGTH, "ChunkedWriter": fast_http1._CHUNKED}.get(
            type(writer).__name__, fast_http1._UNTIL_CLOSE
        )
        theirs = (theirs, framing, getattr(writer, "_length", 0), connection._cstate.keep_alive)
    try:
        ours: Any = fast_http1.response_head(
            status, headers, method, version, version == b"1.1" and not close
        )
    except h11.LocalProtocolError:
        ours = "refused"
    assert ours == theirs
