"""Reading untrusted input so that nothing a caller sends can raise anything but an ``InvalidRequest``.

    decode_json(body)         a JSON document: valid UTF-8, at most ``MAX_DEPTH`` arrays/objects deep
                              (``bounded``: and its integers within 64 bits, a walk: small bodies only)
    decode_object(body, keep) the same for a JSON object, and its field ``keep`` as sent, decoded once
                              per distinct bytes (a coding agent sends the same tools every turn)
    natural(text, high)       an ASCII decimal integer in [0, high], else None ("²".isdigit() is True,
                              and int("²") raises; SQLite takes integers up to 2**63 - 1)
    finite(text)              a float that is neither NaN nor infinite, else None
    group_name_problem(name)  why ``name`` cannot name a group (the CLI, the admin API and the console
                              share this one rule: a group's name is a path segment of the console)

Depth is bounded because everything after the decoder that walks a body (msgspec's convert and encode,
the token estimate, the translators) recurses, on a stack that is deeper than the decoder's was: a
body nested 990 deep decodes and then fails to encode. 128 levels is far more than any request needs
(OpenAI's structured outputs allow 10 levels of schema nesting). It is read from the body's bytes
(:func:`nests_deeper`) when the body holds more than 128 brackets at all.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import msgspec

from core.errors import InvalidRequest
from core.kept import Kept, Shared

MAX_DEPTH = 128
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
GROUP_NAME_RULE = "A group name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit."

_decode = msgspec.json.Decoder().decode
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_kept: Kept[Any] = Kept(4 << 20)  # the values decode_object keeps, by the size of their JSON


def decode_json(body: bytes | str, bounded: bool = False) -> Any:
    """The decoded document, or ``InvalidRequest`` (code ``invalid_json``) saying what is wrong.

    JSON integers have no size: msgspec decodes 401 digits as a Python int, which ``float()`` and the
    stores refuse with an exception. ``bounded``: one outside 64 bits (signed) anywhere is a 400 naming
    its place. A walk of the whole value, so for small bodies (the admin API's); the model calls' bodies
    are converted to structs whose numbers are bounded (core/wire.py) or checked by hand."""
    try:
        value = _decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). The body must be a JSON object.",
            code="invalid_json",
        ) from None
    except UnicodeDecodeError:
        raise InvalidRequest("The JSON body is not valid UTF-8.", code="invalid_json") from None
    except RecursionError:
        raise InvalidRequest(
            f"The JSON body is nested more than {MAX_DEPTH} levels deep.", code="invalid_json"
        ) from None
    # (a str the decoder took is valid UTF-8 once encoded: a batch's lines come as str)
    deep = nests_deeper(body.encode() if isinstance(body, str) else bytes(body), MAX_DEPTH)
    if deep or (deep is None and too_deep(value, MAX_DEPTH)):
        raise InvalidRequest(
            f"The JSON body is nested more than {MAX_DEPTH} levels deep.", code="invalid_json"
        )
    at = outsized(value) if bounded else None
    if at is not None:
        raise InvalidRequest(
            f"'{at}' must be a number from {INT64_MIN} to {INT64_MAX}.", param=at, code="invalid_value"
        )
    return value


def outsized(value: Any) -> str | None:
    """The place (``a.b[2]``) of the first integer in ``value`` outside 64 bits signed, else None
    (iteratively: no recursion)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, at = stack.pop()
        if type(item) is int and not INT64_MIN <= item <= INT64_MAX:
            return at or "body"
        if isinstance(item, dict):
            stack.extend((child, f"{at}.{name}" if at else str(name)) for name, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{i}]") for i, child in enumerate(item))
    return None


def decode_object(body: bytes, keep: str) -> tuple[Any, bytes | None]:
    """:func:`decode_json` of a body that should be an object, and its field ``keep`` as sent (its
    bytes; None if it has none, or the body was read as a whole). That field is decoded once per
    distinct bytes, and the value shared by every body that sends those bytes again: read it, never
    change it (a list is a :class:`core.kept.Shared` one). An agent's tools are the same each turn;
    decoded, they are thousands of objects made and freed per call (Codex's 30 tools: about 330k
    instructions), and their depth is read again.

    One pass reads the fields as bytes; each other field is decoded and its depth read on its own (a
    field is one level inside the body). A body this cannot read so (not an object, malformed, too
    deep, not UTF-8) goes to :func:`decode_json`, whose error it gets; so does a body without the
    field's name (one read of C: most bodies without tools pay nothing more)."""
    if body.find(f'"{keep}"'.encode()) < 0:  # (not ``in``: core/sse.py says why)
        return decode_json(body), None
    try:
        fields = _decode_fields(body)
        value, sent = {}, None
        for name, raw in fields.items():
            if name == keep:
                sent = bytes(raw)
                kept = _kept.get(sent)
                if kept is not None:
                    value[name] = kept
                    continue
            # (a field of fewer bytes than MAX_DEPTH pairs of brackets cannot be too deep)
            if len(raw) >= 2 * MAX_DEPTH and nests_deeper(bytes(raw), MAX_DEPTH - 1) is not False:
                return decode_json(body), None
            value[name] = decoded = _decode(raw)
            if name == keep and isinstance(decoded, list | dict):
                if isinstance(decoded, list):  # (what later stages make of it is kept on it: core/kept.py)
                    value[name] = decoded = Shared(decoded)
                _kept.put(sent, decoded, len(raw))
        return value, sent
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # (msgspec's ValidationError is one)
        return decode_json(body), None


_STRUCTURE = bytes.maketrans(b"{}", b"[]")  # both kinds of bracket as one: only nesting counts
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
SHAPE_MAX = 1 << 18  # brackets: peeling up to MAX_DEPTH levels of more costs about what the walk does


def nests_deeper(document: bytes, limit: int) -> bool | None:
    """Whether a valid JSON ``document`` nests more than ``limit`` arrays/objects, read from its bytes
    in a few passes of C (:func:`too_deep` walks the decoded value in Python, node by node, and an
    agent's tools are hundreds of nodes); None for a body whose brackets are too many to read so
    (:data:`SHAPE_MAX`: the walk then).

    Escapes go first (``\\\\`` pairs, then ``\\"``: what is left of a run of backslashes escapes the
    next character), so the quotes left alternate open / close. Of the brackets and quotes (the shape),
    each pair of adjacent quotes goes: a string without brackets, or the end of one string and the start
    of the next (nothing between them: the two become one string, the brackets outside stay outside).
    Between the quotes left are the strings' own brackets, dropped. What remains is the nesting alone;
    each pass removing every ``[]`` peels one level."""
    shape = document.translate(_STRUCTURE, _NOT_STRUCTURE)
    if shape.count(b"[") <= limit:  # (most bodies: too few brackets to nest that deep)
        return False
    if b"\\" in document:
        document = document.replace(b"\\\\", b"").replace(b'\\"', b"")
        shape = document.translate(_STRUCTURE, _NOT_STRUCTURE)
    if b'"' in shape:
        shape = shape.replace(b'""', b"")
        if b'"' in shape:
            shape = b"".join(shape.split(b'"')[::2])
    if len(shape) > SHAPE_MAX:
        return None
    if b"[" * (limit + 1) in shape:
        return True
    for _ in range(limit):
        shape = shape.replace(b"[]", b"")
        if not shape:
            return False
    return True


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` lists/dicts (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def natural(text: str | None, high: int = INT64_MAX) -> int | None:
    """``text`` as an integer from 0 to ``high`` if it is one (ASCII digits only), else None."""
    if not text or len(text) > 19 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= high else None


def finite(text: str | None) -> float | None:
    """``text`` as a finite float, else None (NaN, infinities and overflow like 1e400 are not numbers)."""
    if not text or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def group_name_problem(name: str) -> str | None:
    """None if ``name`` is a valid group name, else the rule it breaks."""
    return None if GROUP_NAME.fullmatch(name) else GROUP_NAME_RULE


def key_of(text: str) -> bytes:
    """A 32-byte key from its configured form: 64 hex digits, or base64 of 32 bytes (ValueError else)."""
    text = text.strip()
    try:
        raw = (
            bytes.fromhex(text)
            if len(text) == 64
            else base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        )
    except (ValueError, binascii.Error):
        raise ValueError("a seal key is 64 hex digits or the base64 of 32 bytes") from None
    if len(raw) != 32:
        raise ValueError("a seal key is 32 bytes (64 hex digits, or their base64)")
    return raw
