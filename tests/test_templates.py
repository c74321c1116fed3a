"""core/templates.py: byte templates split out of an event's one encoding at its sentinels, refused at
import when a sentinel is missing, found twice or out of order."""

from __future__ import annotations

import msgspec
import pytest

from core.templates import HOLES, INTS, formatting, hole, template


def test_an_event_splits_at_its_sentinels_and_refills_to_its_encoding() -> None:
    def event(index: int, text: str) -> bytes:
        return msgspec.json.encode({"type": "delta", "index": index, "delta": {"text": text}})

    head, middle, tail = template(event(INTS[0], HOLES[0]), hole(INTS[0]), hole(HOLES[0]))
    assert (head, middle, tail) == (b'{"type":"delta","index":', b',"delta":{"text":', b"}}")
    text = 'a "quoted" \u00e9 \\ piece'
    assert b"".join((head, b"12", middle, msgspec.json.encode(text), tail)) == event(12, text)


def test_a_sentinel_missing_found_twice_or_out_of_order_is_refused() -> None:
    once = msgspec.json.encode({"a": HOLES[0], "b": INTS[0]})
    with pytest.raises(ValueError, match="found 0 times"):
        template(once, hole(HOLES[1]))  # a hole the event lost
    twice = msgspec.json.encode({"a": HOLES[0], "b": HOLES[0]})
    with pytest.raises(ValueError, match="found 2 times"):
        template(twice, hole(HOLES[0]))
    with pytest.raises(ValueError, match="out of order"):
        template(once, hole(INTS[0]), hole(HOLES[0]))
    assert len(template(once, hole(HOLES[0]), hole(INTS[0]))) == 3


def test_sentinels_are_distinct_and_found_only_where_they_are() -> None:
    encoded = [hole(value) for value in (*HOLES, *INTS)]
    assert len(set(encoded)) == len(encoded)
    everything = msgspec.json.encode([*HOLES, *INTS])
    assert all(everything.count(e) == 1 for e in encoded)


def test_a_percent_format_escapes_its_pieces() -> None:
    pieces = template(
        msgspec.json.encode({"p": "100%", "n": INTS[0], "s": HOLES[0]}), hole(INTS[0]), hole(HOLES[0])
    )
    form = formatting(pieces, b"%d", b"%b")
    assert form % (5, b'"x"') == msgspec.json.encode({"p": "100%", "n": 5, "s": "x"})
    # a hole filled by a second formatting: the pieces escaped once more
    twice = formatting(tuple(p.replace(b"%", b"%%") for p in pieces), b"%d", b"%%b")
    assert twice % 5 % b'"y"' == msgspec.json.encode({"p": "100%", "n": 5, "s": "y"})
    with pytest.raises(ValueError):
        formatting(pieces, b"%d")
