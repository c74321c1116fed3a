"""h11's checks of an answer's headers, the same rules in fewer steps (:mod:`server.fast_http1` writes
HTTP/1.1 answers by h11's rules without h11's state machine).

h11 converts every name and value with ``bytesify`` and runs each through ``validate`` (a regex and a
function call) whenever it builds an answer. :func:`normalize_and_validate` applies the same regexes
and the same Content-Length and Transfer-Encoding rules to ``bytes`` headers, remembering the names it
has seen valid (a gateway sends the same dozen names again and again); anything else — ``str``
headers, a header h11 would refuse, framing it would repair — goes to h11's own function, which gives
its own answer or error. :func:`valid_name` and :func:`valid_value` are the two checks one header at a
time. ``tests/test_fast_headers.py`` holds each equal to h11's on generated headers, valid and not.
"""

from __future__ import annotations

from typing import Any

import h11._headers as h11_headers

ORIGINAL = h11_headers.normalize_and_validate
_name_ok = h11_headers._field_name_re.fullmatch
field_value_ok = h11_headers._field_value_re.fullmatch  # h11's regex (a match, or None)
_length_ok = h11_headers._content_length_re.fullmatch
MAX_LENGTH_DIGITS = h11_headers.CONTENT_LENGTH_MAX_DIGITS  # the longest Content-Length h11 reads
_Headers = h11_headers.Headers
KNOWN_NAMES: dict[bytes, bytes] = {}  # names found valid → their lower case
_MAX_NAMES = 4096


def normalize_and_validate(headers: Any) -> Any:
    """h11's function: a ``Headers`` of (name, lower-case name, value), or h11's error."""
    out = []
    length: bytes | None = None
    chunked = False
    for pair in headers:
        name, value = pair
        if type(name) is not bytes or type(value) is not bytes or not valid_value(value):
            return ORIGINAL(headers)
        lower = valid_name(name)
        if lower is None:
            return ORIGINAL(headers)
        if lower == b"content-length":
            if length is not None or not _length_ok(value) or len(value) > MAX_LENGTH_DIGITS:
                return ORIGINAL(headers)  # a list, a repeat, anything but digits: h11 decides
            length = value
        elif lower == b"transfer-encoding":
            if chunked or value.lower() != b"chunked":
                return ORIGINAL(headers)
            chunked = True
            value = b"chunked"
        out.append((name, lower, value))
    return _Headers(out)


def valid_name(name: bytes) -> bytes | None:
    """A header's name in lower case if h11 accepts it (a token), else None."""
    lower = KNOWN_NAMES.get(name)
    if lower is None and _name_ok(name):
        lower = name.lower()
        if len(KNOWN_NAMES) < _MAX_NAMES:
            KNOWN_NAMES[name] = lower
    return lower


def valid_value(value: bytes) -> bool:
    """h11 accepts this header value (ASCII letters and digits: a fifth of the regex's cost)."""
    return value.isalnum() or field_value_ok(value) is not None
