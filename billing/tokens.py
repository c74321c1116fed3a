"""Counting tokens offline, for the calls whose upstream never reported usage (a stream the caller
broke off). Uses tiktoken's ``cl100k_base`` with the BPE ranks shipped in this package (verified
against tiktoken's published hash), since these machines cannot download them. Loaded once, on first
use. A text is counted a word at a time, each word's count kept (:func:`count`): exactly the
tokenizer's count, at a fraction of its cost for the words seen before."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

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
    return tiktoken.Encoding(
        name="cl100k_base", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 100257}
    )


def count(text: str) -> int:
    """The tokens of ``text``, exactly as ``encode_ordinary`` gives them, counted a word at a time. The
    text is cut at each space with no whitespace on either side: the pattern's pieces always part
    there (a piece holds a space only first, or in a run of whitespace), so the words' counts add up to
    the text's. Each short word's count is kept (by its hash, never the word), so a text of words seen
    before costs a few dictionary lookups rather than the tokenizer's work (~14k instructions a call,
    ~550 a character: docs/operations.md).
    ``tests/test_tokens.py`` checks the sums against the tokenizer's own count."""
    words = text.split(" ")
    if len(words) < 3:
        return len(encoding().encode_ordinary(text)) if text else 0
    if not _apart(text):
        words = _cut(words)
    rest = words[1:]  # each counted after its space
    counts = list(map(_spaced.get, map(hash, rest)))
    first = _bare.get(hash(words[0]))
    if first is None:
        first = _word(_bare, words[0], words[0])
    try:
        return first + sum(cast("list[int]", counts))  # (a None, of a word not kept, raises)
    except TypeError:  # (a word not kept)
        return first + sum(
            n if n is not None else _word(_spaced, w, " " + w) for n, w in zip(counts, rest, strict=True)
        )


WORD_MAX = 32  # characters: a longer word is counted each time, not kept
WORDS = 16_384  # counts kept at most, of each kind (under 2 MB together); when full, let go all at once
_bare: dict[int, int] = {}  # the hash of a text's first word -> its tokens
_spaced: dict[int, int] = {}  # the hash of a later word -> its tokens with the space before it


def _word(kept: dict[int, int], word: str, text: str) -> int:
    tokens = len(encoding().encode_ordinary(text))
    if len(word) <= WORD_MAX:
        if len(kept) >= WORDS:
            kept.clear()  # (not evicted one by one: callers on worker threads share it)
        kept[hash(word)] = tokens
    return tokens


def _apart(text: str) -> bool:
    """Whether no space in ``text`` has whitespace beside it, tested in C (then every space cuts): no two
    spaces together, and no whitespace but spaces and line breaks, none of which touches a space."""
    if text.find("  ") >= 0:
        return False
    if text.isprintable():  # (no whitespace but spaces)
        return True
    # (and line breaks)
    return text.find(" \n") < 0 and text.find("\n ") < 0 and text.replace("\n", "").isprintable()


def _cut(parts: list[str]) -> list[str]:
    """``parts`` (a text split at its spaces) joined again wherever a space has whitespace (or nothing)
    on either side: such a space may share a piece with the whitespace beside it. ``str.isspace``
    holds for every character the pattern's ``\\s`` matches, and for a few more (then a cut is merely
    missed)."""
    words = [parts[0]]
    for part in parts[1:]:
        last = words[-1]
        if part and last and not part[0].isspace() and not last[-1].isspace():
            words.append(part)
        else:
            words[-1] = f"{last} {part}"
    return words


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
