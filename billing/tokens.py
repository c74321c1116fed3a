"""Counting tokens offline, for the calls whose upstream never reported usage (a stream the caller
broke off). Uses tiktoken's ``cl100k_base`` with the BPE ranks shipped in this package (verified
against tiktoken's published hash), since these machines cannot download them. Loaded once, on first
use."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

DATA = Path(__file__).with_name("data") / "cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)


@functools.cache
def encoding() -> Any:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(DATA), expected_hash=SHA256)
    return tiktoken.Encoding(name="cl100k_base", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 100257})


def count(text: str) -> int:
    return len(encoding().encode_ordinary(text)) if text else 0


def count_request(request: dict[str, Any]) -> int:
    """Prompt tokens of a chat request (a decoded body): its messages, and what providers also bill as
    input: the tool definitions and a ``response_format`` schema (counted as their JSON text)."""
    return count_prompt(prompt_texts(request))


def count_prompt(texts: tuple[int, list[str]]) -> int:
    """The tokens of a prompt as :func:`prompt_texts` gives it. A long text's count is kept (by its
    hash and length, not the text): a conversation sent again with one turn more (a coding agent's
    every turn, its tool definitions) has only the new turn counted."""
    fixed, counted = texts
    return fixed + sum(map(_count_kept, counted))


KEEP_FROM = 1024  # characters: a shorter text is counted again (microseconds)
KEPT = 32_768  # counts kept at most (about 6 MB); when full, they are let go all at once
_kept: dict[tuple[int, int], int] = {}


def to_count(texts: list[str]) -> int:
    """How many characters of these prompt texts :func:`count_prompt` would count (those whose count
    is not kept)."""
    return sum(len(t) for t in texts if (key := _key(t)) is None or key not in _kept)


def _key(text: str) -> tuple[int, int] | None:
    """Where a text's count is kept (None: too short to keep). A wrong count needs two texts of one
    length whose 64-bit hashes collide."""
    return (hash(text), len(text)) if len(text) >= KEEP_FROM else None


def _count_kept(text: str) -> int:
    key = _key(text)
    if key is None:
        return count(text)
    kept = _kept.get(key)
    if kept is None:
        if len(_kept) >= KEPT:
            _kept.clear()  # (not evicted one by one: callers on worker threads share it)
        kept = _kept[key] = count(text)
    return kept


def prompt_texts(request: dict[str, Any]) -> tuple[int, list[str]]:
    """What :func:`count_request` counts of ``request``, without the tokenizer's work: the tokens it
    adds whatever the text (3 per message and the reply's priming, 85 per image), and the texts it
    counts (the content, the assistant's earlier tool calls and the ``tools`` and ``response_format``
    as their JSON)."""
    messages = request.get("messages")
    fixed, texts = 3, []
    for message in messages if isinstance(messages, list) else ():
        fixed += 3
        if not isinstance(message, dict):
            continue
        if message.get("tool_calls"):
            texts.append(_json(message["tool_calls"]))
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    if part.get("type") == "text":
                        texts.append(str(part.get("text", "")))
                    elif part.get("type") == "image_url":
                        fixed += 85
    for extra in (request.get("tools"), request.get("response_format")):
        if extra:
            texts.append(_json(extra))
    return fixed, texts


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()
