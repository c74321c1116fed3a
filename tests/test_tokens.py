"""billing/tokens.py: a prompt's long texts have their counts kept (by hash and length, never the text),
so a conversation sent again with one turn more has only the new turn counted; the counts are the
tokenizer's."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from billing import tokens

TOOLS = '[{"type": "function", "name": "shell", "description": "runs a command"}] ' * 40  # (over KEEP_FROM)
TURN = "a question about the router and the way it bills each call, " * 30


def test_a_long_text_is_counted_once_and_a_changed_one_again(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens._kept.clear()
    counted: list[str] = []
    real = tokens.count

    def spy(text: str) -> Any:
        counted.append(text)
        return real(text)

    monkeypatch.setattr(tokens, "count", spy)
    first = tokens.count_prompt((6, [TOOLS, "short", TURN]))
    assert first == 6 + real(TOOLS) + real("short") + real(TURN)
    again = "".join(list(TURN))  # (an equal text, another object: as the next call's body decodes it)
    assert tokens.count_prompt((9, [TOOLS, "short", again, TURN + "?"])) == 9 + real(TOOLS) + real(
        "short"
    ) + real(TURN) + real(TURN + "?")
    assert counted == [TOOLS, "short", TURN, "short", TURN + "?"]  # the long ones kept; a changed one anew
    assert all(not isinstance(key, str) and len(key) == 2 for key in tokens._kept)  # (no text kept)


def test_the_kept_counts_are_let_go_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens._kept.clear()
    monkeypatch.setattr(tokens, "KEPT", 2)
    texts = [TURN + str(n) for n in range(5)]
    assert [tokens.count_prompt((0, [t])) for t in texts] == [tokens.count(t) for t in texts]
    assert len(tokens._kept) <= 2


def test_what_is_left_to_count_leaves_out_the_kept_counts() -> None:
    tokens._kept.clear()
    assert tokens.to_count([TOOLS, "short"]) == len(TOOLS) + len("short")
    tokens.count_prompt((0, [TOOLS]))
    assert tokens.to_count([TOOLS, "short"]) == len("short")


# every character class the pattern tells apart, and every kind of whitespace (Unicode's White_Space, and
# the few more that str.isspace holds for), with spaces, runs of them and contractions more likely
ALPHABET = [
    *"ab cdZ ,.!?'/-_1234",
    "é",
    "ß",
    "中",
    "Ω",
    "😀",
    "\u0301",
    "’",
    "'s",
    "'ll",
    "'T",
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2003",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    "\u200b",
    "\u180e",
    "\ufeff",
    " the",
    " router",
]


PLAIN = ["a", "bc", "Z", ".", "'s", "7", " ", " ", " ", "\n"]


def test_a_text_counted_a_word_at_a_time_has_the_tokenizers_count() -> None:
    rng = random.Random(41)
    encode = tokens.encoding().encode_ordinary
    for n in range(30_000):  # a third of them of words, spaces and line breaks only (the quick test's cases)
        alphabet = ALPHABET if n % 3 else PLAIN
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert tokens.count(text) == len(encode(text)), repr(text)
        if n % 1000 == 0:  # (and again once its words are kept)
            assert tokens.count(text) == len(encode(text)), repr(text)
    prose = (Path(tokens.__file__).parent.parent / "README.md").read_text()
    assert tokens.count(prose) == len(encode(prose))
    for line in prose.splitlines():
        assert tokens.count(line) == len(encode(line)), repr(line)


def test_the_kept_word_counts_hold_no_text_and_are_let_go_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "WORDS", 8)
    tokens._bare.clear()
    tokens._spaced.clear()
    text = " ".join(f"word{n}" for n in range(40))
    assert tokens.count(text) == len(tokens.encoding().encode_ordinary(text))
    assert 0 < len(tokens._spaced) <= 8 and len(tokens._bare) == 1
    assert all(isinstance(key, int) for key in [*tokens._spaced, *tokens._bare])
    long = "x" * (tokens.WORD_MAX + 1)
    tokens._spaced.clear()
    assert tokens.count(f"a {long} b") == len(tokens.encoding().encode_ordinary(f"a {long} b"))
    assert len(tokens._spaced) == 1  # (" b" kept; the long word counted, not kept)
