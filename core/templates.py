"""Byte templates derived from an event's one definition.

A streamed event the hot path writes as bytes around its values (a text delta: the frame up to the
piece, the piece's JSON, the frame's end) is defined once, as the general path builds it (a dict, in
its key order); its template is that event encoded once, at import, with a sentinel in each hole (a
string whose JSON can be found exactly once, an integer no event carries), and split at the sentinels'
encodings. A template that would drift from its event cannot be built: a sentinel not found exactly
once, or found out of order, raises at import.

    pieces = template(frame(delta(HOLES[0], INTS[0])), hole(HOLES[0]), hole(INTS[0]))
    b"".join((pieces[0], _encode(piece), pieces[1], str(index).encode(), pieces[2]))
"""

from __future__ import annotations

import msgspec

# string sentinels: a control character (JSON-escaped, so never in a key or a constant) and a number
HOLES = tuple(f"\u0001hole{n}\u0001" for n in range(8))
# integer sentinels: larger than any count or index an event carries
INTS = tuple(7_000_000_001 + n for n in range(8))


def hole(value: str | int) -> bytes:
    """A sentinel's JSON encoding: what :func:`template` splits at."""
    return msgspec.json.encode(value)


def template(data: bytes, *holes: bytes) -> tuple[bytes, ...]:
    """``data`` split at each of ``holes`` in order: ``len(holes) + 1`` pieces. Raises ValueError unless
    each hole is found in ``data`` exactly once, after the previous one."""
    pieces: list[bytes] = []
    start = 0
    for at in holes:
        found = data.count(at)
        if found != 1:
            raise ValueError(f"template hole {at!r} found {found} times in {data!r}")
        end = data.find(at, start)
        if end < 0:
            raise ValueError(f"template hole {at!r} out of order in {data!r}")
        pieces.append(data[start:end])
        start = end + len(at)
    pieces.append(data[start:])
    return tuple(pieces)


def formatting(pieces: tuple[bytes, ...], *specs: bytes) -> bytes:
    """A %-format of ``pieces`` with ``specs`` (``b"%d"``, ``b"%b"``, or ``b"%%d"`` for a hole filled by
    a second formatting) between them; a ``%`` in a piece is escaped as ``%%``."""
    out = [pieces[0].replace(b"%", b"%%")]
    for spec, piece in zip(specs, pieces[1:], strict=True):  # (a spec per hole, or ValueError)
        out += (spec, piece.replace(b"%", b"%%"))
    return b"".join(out)
