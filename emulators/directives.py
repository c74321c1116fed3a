"""What every emulator answers, decided the same way: tokens, deterministic replies, and the fault
directives.

Directives are magic words in the last user message:

    [fault:429] [fault:500] [fault:503] [fault:529]   answer with that HTTP error (429 has retry-after)
    [fault:402]      the provider account is out of credit, as each provider says it: OpenAI 429
                     insufficient_quota, Anthropic 402 billing_error, Gemini 400 FAILED_PRECONDITION
                     (Mistral and Upstage: ignored, their way of saying it is not documented)
    [slow:MS]        wait MS milliseconds before the first byte
    [delay:MS]       wait MS milliseconds between stream events
    [cut:N]          stream: drop the connection after N content events; non-stream: after part of
                     the body (N is ignored)
    [midfail]        stream: send an in-band error event after the first content event
    [malformed]      send a body / stream event that is not valid JSON
    [tokens:N]       answer with N tokens (still capped by the request's max tokens)
    [echo]           answer with the user's text itself (directives removed)
    [split]          stream: write the bytes in 1-3 byte pieces (splits UTF-8 characters)
    [tool]           call the first tool offered (also when tool_choice forces one)
    [flaky:N]        the first N requests with this same text get a 503, later ones succeed
    [limited:N]      the first N requests with this same text get a 429 with retry-after 0.1
    [think]          produce reasoning output before the answer (providers that have it)
    [call:NAME {...}]  call the tool named NAME (if offered; else as [tool]) with these arguments (JSON
                     without brackets; without it, arguments that fit the tool's schema)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from emulators.schema_values import instance

_TOKEN = re.compile(r"\w+|[^\w\s]")
_PIECE = re.compile(r"\s*\S+")
_DIRECTIVE = re.compile(
    r"\[(fault|slow|delay|cut|tokens|flaky|limited):(\d+)\]|\[(midfail|malformed|echo|split|tool|think)\]"
)
_CALL = re.compile(r"\[call:([A-Za-z0-9_.-]+)(?:\s+(\{[^\[\]]*\}))?\]")

WORDS = (
    "the router answers every call with care and the credits are billed exactly while streams flow "
    "through the gateway one chunk after another until the answer is complete and nothing is lost"
).split()


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


@dataclass
class Directives:
    fault: int | None = None
    slow_ms: int = 0
    delay_ms: int = 0
    cut: int | None = None
    tokens: int | None = None
    flaky: int = 0
    limited: int = 0
    midfail: bool = False
    malformed: bool = False
    echo: bool = False
    split: bool = False
    tool: bool = False
    think: bool = False
    call: str | None = None  # [call:NAME]: the tool to call
    call_input: dict[str, Any] | None = None  # and its arguments, if given
    text: str = ""

    def tool_index(self, names: list[str]) -> int:
        """Which of the offered tools (by name) the model calls: the one [call:NAME] names, else the first."""
        return names.index(self.call) if self.call in names else 0

    def arguments(self, name: str, schema: Any) -> dict[str, Any]:
        """The arguments of a call of the tool ``name``: those [call:NAME {...}] gives, else ones that fit."""
        if self.call == name and self.call_input is not None:
            return self.call_input
        return fake_arguments(schema)


_NUMBERS = {"slow": "slow_ms", "delay": "delay_ms"}  # [name:N] → the field it sets (else the same name)


def directives(text: str) -> Directives:
    d = Directives()
    for match in _DIRECTIVE.finditer(text):
        name, value, flag = match.group(1), match.group(2), match.group(3)
        if name:
            setattr(d, _NUMBERS.get(name, name), int(value))
        elif flag:
            setattr(d, flag, True)
    call = _CALL.search(text)
    if call is not None:
        d.call, d.tool = call.group(1), True
        try:
            given = json.loads(call.group(2)) if call.group(2) else None
        except ValueError:
            given = None
        d.call_input = given if isinstance(given, dict) else None
        text = _CALL.sub("", text)
    d.text = _DIRECTIVE.sub("", text).strip()
    return d


def reply_pieces(prompt: str, d: Directives, cap: int | None) -> tuple[list[str], bool]:
    """The answer as stream pieces (one token each, leading space kept) and whether ``cap`` cut it."""
    if d.echo and d.text:
        pieces = _PIECE.findall(d.text)
    else:
        n = d.tokens if d.tokens is not None else 12
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
        pieces = [("" if i == 0 else " ") + WORDS[(seed + i * 7) % len(WORDS)] for i in range(n)]
        if pieces:
            pieces[0] = pieces[0].capitalize()
            pieces[-1] += "."
    if cap is not None and len(pieces) > cap:
        return pieces[:cap], True
    return pieces, False


def fake_arguments(schema: dict[str, Any] | None) -> dict[str, Any]:
    """Arguments that satisfy a tool's JSON schema (every property, the right types)."""
    value = instance(schema) if isinstance(schema, dict) else {}
    return value if isinstance(value, dict) else {}


def structured_pieces(schema: Any, cap: int | None, variant: int = 0) -> tuple[list[str], bool]:
    """A JSON answer to structured output (``schema``: a JSON schema, or None for JSON mode), as stream
    pieces of a few characters (about a token each), and whether ``cap`` cut it (then it is not valid
    JSON, as a real model's cut answer is not)."""
    text = json.dumps(
        instance(schema if isinstance(schema, dict) else {"type": "object"}, variant=variant),
        ensure_ascii=False,
    )
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    if cap is not None and len(pieces) > cap:
        return pieces[:cap], True
    return pieces, False


class Flakiness:
    """Counts requests by their text, for the [flaky:N] and [limited:N] directives."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def fault(self, text: str, d: Directives) -> int | None:
        """The status this request should fail with, if any."""
        if not (d.flaky or d.limited):
            return None
        count = self.seen.get(text, 0) + 1
        self.seen[text] = count
        if count <= d.flaky:
            return 503
        if count <= d.limited:
            return 429
        return None
