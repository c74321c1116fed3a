"""router.fast_headers gives what h11's own header check gives, on generated headers valid and not:
the same normalised headers, or the same error."""

from __future__ import annotations

from typing import Any

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from router import fast_headers

NAMES = st.one_of(
    st.sampled_from([b"content-type", b"Content-Length", b"content-length", b"Transfer-Encoding", b"x-request-id",
                     b"X-RateLimit-Remaining-Requests", b"date", b"bad name", b"", b"n\xe9", b"a:b"]),
    st.binary(max_size=12),
    st.text(max_size=8),
)  # fmt: skip
VALUES = st.one_of(
    st.sampled_from([b"application/json", b"12", b"012", b"12, 12", b"12,13", b" 12", b"chunked", b"CHUNKED",
                     b"gzip", b"", b"a\r\nb", b"tab\there", b"99999999999999999999999", b"\xff"]),
    st.binary(max_size=16),
    st.text(max_size=8),
)  # fmt: skip


def _outcome(fn: Any, headers: list[tuple[Any, Any]]) -> tuple[str, Any]:
    try:
        return "ok", list(fn(headers)._full_items)
    except h11.LocalProtocolError as exc:
        return "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - compared by type and text
        return type(exc).__name__, str(exc)


@settings(max_examples=3000, derandomize=True)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=6))
def test_the_fast_check_agrees_with_h11(headers: list[tuple[Any, Any]]) -> None:
    assert _outcome(fast_headers.normalize_and_validate, headers) == _outcome(fast_headers.ORIGINAL, headers)


VALID = st.lists(st.tuples(st.sampled_from([b"content-type", b"Content-Length", b"Transfer-Encoding", b"Connection",
                                            b"connection", b"x-request-id", b"date"]),
                           st.sampled_from([b"application/json", b"12", b"chunked", b"close", b"keep-alive", b"r1"])),
                 max_size=6)  # fmt: skip
COMMA_NAMES = st.sampled_from([b"content-length", b"transfer-encoding", b"connection", b"x-request-id"])
COMMA_VALUES = st.lists(st.sampled_from([b"chunked", b"close", b"12", b"gzip", b"a\r\nb", b"1, 2"]), max_size=3)


@settings(max_examples=3000, derandomize=True)
@given(VALID, COMMA_NAMES, COMMA_VALUES)
def test_setting_a_comma_header_agrees_with_h11(headers: list[tuple[bytes, bytes]], name: bytes,
                                                values: list[bytes]) -> None:  # fmt: skip
    checked = _outcome(fast_headers.ORIGINAL, headers)
    if checked[0] != "ok":
        return  # h11 sets comma headers only on headers it has checked
    parsed = fast_headers.ORIGINAL(headers)
    assert _outcome(lambda h: fast_headers.set_comma_header(h, name, values), parsed) == _outcome(
        lambda h: fast_headers.ORIGINAL_SET(h, name, values), parsed
    )


def test_install_is_what_h11_calls() -> None:
    fast_headers.install()
    response = h11.Response(status_code=200, headers=[(b"Content-Length", b"2"), (b"x-request-id", b"r")])
    assert list(response.headers._full_items) == [(b"Content-Length", b"content-length", b"2"),
                                                   (b"x-request-id", b"x-request-id", b"r")]  # fmt: skip
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.next_event()
    head = conn.send(h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream")]))
    assert head is not None and b"Transfer-Encoding: chunked" in head


@settings(max_examples=300, derandomize=True)
@given(VALID)
def test_iterating_headers_gives_what_indexing_gives(headers: list[tuple[bytes, bytes]]) -> None:
    fast_headers.install()
    if _outcome(fast_headers.ORIGINAL, headers)[0] != "ok":
        return
    parsed = fast_headers.ORIGINAL(headers)
    assert list(parsed) == [parsed[i] for i in range(len(parsed))]
    assert all(pair in parsed for pair in list(parsed))


LINES = st.lists(
    st.one_of(
        st.sampled_from([b"Host: x", b"Content-Length: 2", b"content-type:application/json", b"X-A:  spaced  ",
                         b" folded on", b"\tfolded tab", b"bad line", b": empty name", b"Empty:", b"A: b\x00c",
                         b"Transfer-Encoding: chunked", b"X-\xff: v", b"X: \xe9t\xe9"]),
        st.binary(max_size=12),
    ),
    max_size=6,
)  # fmt: skip


def _pairs(fn: Any, lines: list[bytes]) -> tuple[str, Any]:
    return _outcome(lambda ls: h11._headers.Headers([(n, n, v) for n, v in fn(ls)]), lines)


@settings(max_examples=3000, derandomize=True)
@given(LINES)
def test_reading_header_lines_agrees_with_h11(lines: list[bytes]) -> None:
    assert _pairs(fast_headers.decode_header_lines, lines) == _pairs(fast_headers.ORIGINAL_DECODE, lines)


PARSED = st.lists(
    st.tuples(st.sampled_from([b"Host", b"Content-Length", b"content-length", b"Transfer-Encoding", b"X-Id", b"accept"]),
              st.sampled_from([b"2", b"02", b"2, 2", b"2,3", b"", b"chunked", b"Chunked", b"gzip", b"a b"])),
    max_size=6,
)  # fmt: skip


@settings(max_examples=3000, derandomize=True)
@given(PARSED)
def test_parsed_headers_agree_with_h11(headers: list[tuple[bytes, bytes]]) -> None:
    ours = _outcome(lambda h: fast_headers.normalize_and_validate(h, _parsed=True), headers)
    assert ours == _outcome(lambda h: fast_headers.ORIGINAL(h, _parsed=True), headers)
