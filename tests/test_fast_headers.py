"""server.fast_headers gives what h11's own header checks give, on generated headers valid and not:
the same normalised headers, or the same error."""

from __future__ import annotations

from typing import Any

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from server import fast_headers

NAMES = st.one_of(
    st.sampled_from(
        [
            b"content-type",
            b"Content-Length",
            b"content-length",
            b"Transfer-Encoding",
            b"x-request-id",
            b"X-RateLimit-Remaining-Requests",
            b"date",
            b"bad name",
            b"",
            b"n\xe9",
            b"a:b",
        ]
    ),
    st.binary(max_size=12),
    st.text(max_size=8),
)
VALUES = st.one_of(
    st.sampled_from(
        [
            b"application/json",
            b"12",
            b"012",
            b"12, 12",
            b"12,13",
            b" 12",
            b"chunked",
            b"CHUNKED",
            b"gzip",
            b"",
            b"a\r\nb",
            b"tab\there",
            b"99999999999999999999999",
            b"\xff",
        ]
    ),
    st.binary(max_size=16),
    st.text(max_size=8),
)


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


@settings(max_examples=2000, derandomize=True)
@given(st.binary(max_size=12), VALUES.filter(lambda v: isinstance(v, bytes)))
def test_one_header_checks_agree_with_h11(name: bytes, value: bytes) -> None:
    assert (fast_headers.valid_name(name) is not None) == (
        h11._headers._field_name_re.fullmatch(name) is not None
    )
    assert fast_headers.valid_name(name) in (None, name.lower())
    assert fast_headers.valid_value(value) == (h11._headers._field_value_re.fullmatch(value) is not None)
