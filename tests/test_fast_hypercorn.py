"""router/fast_hypercorn.py against hypercorn's own steps: the request headers' reading and the
response headers' copy, on generated headers (h11 gives a request's headers lower-case names and
values without surrounding whitespace; the response's come from the app as they are)."""

from __future__ import annotations

from typing import Any

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import fast_hypercorn

_values = st.sampled_from([b"", b"websocket", b"WebSocket", b"h2c", b"H2C", b"upgrade", b"keep-alive, Upgrade",
                           b"close", b"Upgrade ,x", b"12", b"chunked", b"a\tb"])  # fmt: skip
_names = st.sampled_from([b"upgrade", b"connection", b"content-length", b"transfer-encoding", b"host", b"x-a"])


def hypercorn_reading(headers: Any) -> tuple[str, str, bool]:
    """What hypercorn 0.18's ``_check_protocol`` and ``_create_stream`` read from a request's headers
    (their loops, word for word)."""
    upgrade_value = connection_value = ""
    has_body = False
    for name, value in headers:
        sanitised_name = name.decode("latin1").strip().lower()
        if sanitised_name == "upgrade":
            upgrade_value = value.decode("latin1").strip()
        elif sanitised_name == "connection":
            connection_value = value.decode("latin1").strip()
        elif sanitised_name in {"content-length", "transfer-encoding"}:
            has_body = True
    return upgrade_value, connection_value, has_body


@settings(max_examples=500, deadline=None)
@given(pairs=st.lists(st.tuples(_names, _values), max_size=6), method=st.sampled_from([b"GET", b"get", b"POST"]))
def test_one_pass_over_a_requests_headers_reads_what_hypercorn_reads(pairs: list[tuple[bytes, bytes]],
                                                                     method: bytes) -> None:  # fmt: skip
    try:
        request = h11.Request(method=method, target=b"/", headers=[(b"host", b"x"), *pairs])
    except h11.LocalProtocolError:
        return  # (h11 refuses it: never reaches hypercorn)
    upgrade, connection, has_body = fast_hypercorn.framing_headers(request.headers)
    assert (upgrade, connection, has_body) == hypercorn_reading(request.headers)
    assert fast_hypercorn.websocket(upgrade, connection, request.method) == (
        any(t.strip() == "upgrade" for t in connection.lower().split(",")) and upgrade.lower() == "websocket"
        and request.method.decode("ascii").upper() == "GET"
    )  # fmt: skip


_raw = st.one_of(st.binary(max_size=6), st.builds(bytearray, st.binary(max_size=6)),
                 st.sampled_from([b" a ", b":path", b"", b"x-y"]))  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(headers=st.lists(st.tuples(_raw, _raw), max_size=5))
def test_the_response_headers_copy_is_hypercorns(headers: list[tuple[Any, Any]]) -> None:
    def outcome(build: Any) -> Any:
        try:
            return build(headers)
        except (ValueError, IndexError) as exc:
            return type(exc)
    assert outcome(fast_hypercorn.build_and_validate_headers) == outcome(fast_hypercorn.ORIGINAL_BUILD)


def test_install_puts_them_where_hypercorn_looks() -> None:
    import hypercorn.protocol.http_stream as http_stream

    fast_hypercorn.install()
    assert http_stream.build_and_validate_headers is fast_hypercorn.build_and_validate_headers
    assert fast_hypercorn.H11Protocol._create_stream is fast_hypercorn.create_stream
    with pytest.raises(ValueError, match="Pseudo"):
        fast_hypercorn.build_and_validate_headers([(b":authority", b"x")])
