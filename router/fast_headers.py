"""h11's header check, the same rules in fewer steps (hypercorn serves HTTP/1.1 through h11).

h11 normalises and validates a response's headers whenever it builds one: once for an answer, three
times for a stream (the ``Response`` event, then twice more when it sets chunked framing). Each pass
converts every name and value with ``bytesify`` and runs each through ``validate`` (a regex and a
function call), and that came to about a tenth of the instructions of a streamed call.
:func:`normalize_and_validate` applies the same regexes and the same Content-Length and
Transfer-Encoding rules to ``bytes`` headers, remembering the names it has seen valid (a gateway
sends the same dozen names again and again); anything else — ``str`` headers, a header h11 would
refuse, framing it would repair — goes to h11's own function, which gives its own answer or error.
``tests/test_fast_headers.py`` holds the two equal on generated headers, valid and not.

:func:`set_comma_header` is h11's (how it sets chunked framing on a stream and ``Connection: close``)
without checking again the headers it keeps: they come from a ``Headers`` that was checked when it was
made, and every rule is about one name, all of whose lines it replaces; only the new lines are
checked. A stream's head was checked three times, now once and a line.

A request's header lines are read by :func:`decode_header_lines` into one list (h11 runs two
generators and builds a dict per line), the headers h11's parser read go through the same names cache
(``_parsed``: no regex, as h11 skips them too), and iterating a ``Headers`` goes over its list rather
than ``Sequence.__iter__``'s ``__getitem__`` per line. The tests hold each equal to h11's own.

:func:`install` puts them where h11 looks them up (``h11._events``, ``h11._headers``,
``h11._connection``, ``h11._readers``, the ``Headers`` class); ``router.serve`` calls it for the
processes it runs.
"""

from __future__ import annotations

from typing import Any

import h11._connection as h11_connection
import h11._events as h11_events
import h11._headers as h11_headers
import h11._readers as h11_readers

ORIGINAL = h11_headers.normalize_and_validate
ORIGINAL_SET = h11_headers.set_comma_header
ORIGINAL_DECODE = h11_readers._decode_header_lines
_header_line = h11_readers.header_field_re.fullmatch
_FOLD = (b" ", b"\t")  # what begins a line that continues the one before
_name_ok = h11_headers._field_name_re.fullmatch
_value_ok = h11_headers._field_value_re.fullmatch
_length_ok = h11_headers._content_length_re.fullmatch
_MAX_DIGITS = h11_headers.CONTENT_LENGTH_MAX_DIGITS
_Headers = h11_headers.Headers
_names: dict[bytes, bytes] = {}  # names found valid → their lower case
_MAX_NAMES = 4096


def normalize_and_validate(headers: Any, _parsed: bool = False) -> Any:
    """h11's function; ``_parsed``: headers its parser has read (names and values checked by its
    regexes already), as h11 skips those checks for them."""
    out = []
    length: bytes | None = None
    chunked = False
    for pair in headers:
        name, value = pair
        # (ASCII letters and digits are a valid value: isalnum() is a fifth of the regex's cost)
        if not _parsed and (type(name) is not bytes or type(value) is not bytes
                            or not (value.isalnum() or _value_ok(value))):  # fmt: skip
            return ORIGINAL(headers)
        lower = _names.get(name)
        if lower is None:
            if not _parsed and not _name_ok(name):
                return ORIGINAL(headers)
            lower = name.lower()
            if len(_names) < _MAX_NAMES:
                _names[name] = lower
        if lower == b"content-length":
            if length is not None or not _length_ok(value) or len(value) > _MAX_DIGITS:
                return ORIGINAL(headers, _parsed)  # a list, a repeat, anything but digits: h11 decides
            length = value
        elif lower == b"transfer-encoding":
            if chunked or value.lower() != b"chunked":
                return ORIGINAL(headers, _parsed)
            chunked = True
            value = b"chunked"
        out.append((name, lower, value))
    return _Headers(out)


def decode_header_lines(lines: Any) -> Any:
    """h11's ``_decode_header_lines`` (a request's header lines → (name, value) pairs, each line
    checked by its regex) as one list, without its two generators and ``validate``'s dict; a line that
    continues the one before (obsolete folding) or does not match goes to h11's own, which folds it
    or raises its error."""
    out = []
    for line in lines:
        match = _header_line(line)
        if match is None or line[:1] in _FOLD:
            return ORIGINAL_DECODE(lines)
        out.append(match.group(1, 2))
    return out


def set_comma_header(headers: Any, name: bytes, new_values: list[bytes]) -> Any:
    kept = [item for item in headers._full_items if item[1] != name]
    if new_values:
        title = name.title()
        kept += normalize_and_validate([(title, value) for value in new_values])._full_items
    return _Headers(kept)


def _iter_headers(self: Any) -> Any:
    return iter([(name, value) for _, name, value in self._full_items])


def install() -> None:
    for module in (h11_headers, h11_events):  # where h11 looks the function up
        setattr(module, "normalize_and_validate", normalize_and_validate)  # noqa: B010
    for module in (h11_headers, h11_connection):
        setattr(module, "set_comma_header", set_comma_header)  # noqa: B010
    setattr(_Headers, "__iter__", _iter_headers)  # noqa: B010
    setattr(h11_readers, "_decode_header_lines", decode_header_lines)  # noqa: B010
