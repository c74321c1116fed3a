"""billing/tokens.py: a prompt's long texts have their counts kept (by hash and length, never the text),
so a conversation sent again with one turn more has only the new turn counted; the counts are the
tokenizer's."""

from __future__ import annotations

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
    assert tokens.count_prompt((9, [TOOLS, "short", again, TURN + "?"])) == 9 + real(TOOLS) + real("short") + real(TURN) + real(TURN + "?")
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
