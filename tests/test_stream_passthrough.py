"""The stream path's pass-through of plain OpenAI chunks (gateway/stream.py ``Shaper.pass_through``)
gives the caller exactly what the general path (translator → ``Shaper.shape``) gives: the same JSON,
key order included, and the same state (role sent, finished choices, text kept for estimates)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from adapters import ADAPTERS
from adapters.base import Call
from core.catalog import Catalog
from core.sse import Event
from core.wire import parse_chat_request
from gateway.stream import Shaper

MODEL = "openai/gpt-4o-mini"
HEAD = '{"id":"chatcmpl-up","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini"'


def chunk(choices: str, tail: str = ',"usage":null', before: str = "") -> bytes:
    return (HEAD + before + ',"choices":[' + choices + "]" + tail + "}").encode()


def text(content: str, extra: str = "", reason: str = "null") -> str:
    return '{"index":0,"delta":{' + content + '},"finish_reason":' + reason + ',"logprobs":null' + extra + "}"


def openai(content: str, reason: str = "null") -> str:
    """A choice as OpenAI orders its keys (logprobs before finish_reason)."""
    return '{"index":0,"delta":{' + content + '},"logprobs":null,"finish_reason":' + reason + "}"


FP = ',"service_tier":"default","system_fingerprint":"fp_1"'
OB = ',"usage":null,"obfuscation":"%s"'

STREAMS = {
    "plain": [
        chunk(text('"role":"assistant","content":""')),
        chunk(text('"content":"Hel\\u00e9lo"')),
        chunk(text('"content":" \\"quoted\\" usage"')),
        chunk(text("", reason='"stop"')),
        chunk("", tail=',"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}'),
    ],
    "no usage key": [
        chunk(text('"role":"assistant","content":"a"'), tail=""),
        chunk(text('"content":"b"'), tail=""),
        chunk(text("", reason='"length"'), tail=""),
    ],
    "extra fields": [
        chunk(text('"role":"assistant","content":"a"'), tail=',"usage":null,"obfuscation":"xy"'),
        chunk(text('"content":"b"'), before=',"system_fingerprint":"fp_1"'),
        chunk(text('"content":"c"'), tail=',"service_tier":"default","usage":null'),
        chunk(text("", reason='"stop"')),
    ],
    "no role first": [chunk(text('"content":"a"')), chunk(text('"content":"b"', reason='"stop"'))],
    "tools and refusal": [
        chunk(text('"role":"assistant","content":null,"refusal":null')),
        chunk(
            text(
                '"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]'
            )
        ),
        chunk(text("", reason='"tool_calls"')),
    ],
    "two choices": [
        chunk(
            text('"role":"assistant","content":"a"')
            + ","
            + text('"role":"assistant","content":"b"').replace('"index":0', '"index":1')
        ),
        chunk(text('"content":"c"')),
        chunk(text("", reason='"stop"')),
    ],
    "after finish": [
        chunk(text('"role":"assistant","content":"a"')),
        chunk(text("", reason='"stop"')),
        chunk(text('"content":"late"')),
    ],
    # the short way for choice 0's text chunks after its first (Shaper._text_chunk), and what it must refuse
    "openai order": [
        chunk(openai('"role":"assistant","content":""')),
        chunk(openai('"content":"a},\\"b"')),
        chunk(openai('"content":"\\u00e9\\n"')),
        chunk(openai('"content":"c"'), tail=""),
        chunk(openai('"content":"d"'), tail=',"usage":null,"obfuscation":"x"'),
        chunk(openai('"content":"e","refusal":null')),
        chunk(openai('"content":null')),
        chunk(openai('"content":"f"').replace('"logprobs":null', '"logprobs":{"content":[]}')),
        chunk(openai("", reason='"stop"')),
        chunk(openai('"content":"late"')),
    ],
    "new upstream head": [
        chunk(text('"role":"assistant","content":"a"')),
        chunk(text('"content":"b"')),
        chunk(text('"content":"c"')).replace(b"chatcmpl-up", b"chatcmpl-up2"),
        chunk(text('"content":"d"'), tail=""),
        chunk(text("", reason='"stop"')),
    ],
    # as OpenAI sends them: service_tier and system_fingerprint before the choices, obfuscation after
    "openai fields": [
        chunk(openai('"role":"assistant","content":""'), before=FP, tail=OB % "a"),
        chunk(openai('"content":"Hi"'), before=FP, tail=OB % "bc"),
        chunk(openai('"content":" \\"there\\""'), before=FP, tail=OB % "d"),
        chunk(openai('"content":"!"'), before=FP, tail=',"obfuscation":"e"'),
        chunk(openai('"content":"x"'), before=FP, tail=',"obfuscation":"f","usage":null'),
        chunk(openai('"content":"y"'), before=',"system_fingerprint":"fp_2"', tail=OB % "g"),
        chunk(openai('"content":"z"'), before=',"meta":{"a":1}', tail=OB % "h"),
        chunk(openai("", reason='"stop"'), before=FP, tail=OB % "i"),
        chunk("", before=FP, tail=',"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'),
    ],
    # the text kept for estimates on the short way: escapes kept as they came, a string with spaces
    # around it, characters past the BMP
    "text kept": [
        chunk(text('"role":"assistant","content":"a"')),
        chunk(text('"content":"\\u00e9\\ud83d\\ude00\\\\"')),
        chunk(text('"content": "spaced" ')),
        chunk(text('"content":"é😀\\n"')),
        chunk(text('"content":"\\\\"')),
        chunk(text("", reason='"stop"')),
    ],
    "odd finish": [chunk(text('"role":"assistant","content":"a"')), chunk(text("", reason='"model_length"'))],
}


def run(lines: list[bytes], include_usage: bool, fast: bool) -> tuple[list[list[Any]], int, tuple[Any, ...]]:
    catalog = Catalog.load(None)
    model = catalog.resolve(MODEL)
    adapter = ADAPTERS["openai"]("openai", catalog.providers["openai"])
    _, request = parse_chat_request(
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    )
    call = Call(MODEL, model, None, {}, request, True, include_usage)  # type: ignore[arg-type]
    shaper = Shaper(call, "chatcmpl-ours", 1800000000)
    translator = adapter.stream(call)
    out: list[Any] = []
    passed = 0
    for data in lines:
        if fast and translator.passthrough:
            piece = shaper.pass_through(data)
            if piece is not None:
                out.append(piece)
                passed += 1
                continue
        for c in translator.feed(Event(None, data)):
            shaper.shape(c, out)
    as_json = [list(json.loads(c if isinstance(c, bytes) else msgspec.json.encode(c)).items()) for c in out]
    return as_json, passed, (sorted(shaper.finished), sorted(shaper.role_sent), shaper.generated())


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("name", list(STREAMS))
def test_pass_through_equals_the_general_path(name: str, include_usage: bool) -> None:
    general, none_passed, state = run(STREAMS[name], include_usage, fast=False)
    fast, passed, fast_state = run(STREAMS[name], include_usage, fast=True)
    assert none_passed == 0
    assert fast == general
    assert fast_state == state
    if name in ("plain", "no usage key", "new upstream head"):
        assert passed == len(STREAMS[name]) - (name == "plain")  # all but the usage-only chunk
    if name == "openai fields":
        assert passed == 3  # the text chunks whose fields between model and choices are the first's
    if name == "openai order":
        assert passed == 7  # not the refusal nor the logprobs; nothing after the finish


def test_chunks_carry_our_id_and_the_callers_model() -> None:
    fast, passed, _ = run(STREAMS["plain"], False, fast=True)
    assert passed == 4
    for items in fast[:4]:
        head = dict(items[:4])
        assert head == {
            "id": "chatcmpl-ours",
            "object": "chat.completion.chunk",
            "created": 1800000000,
            "model": MODEL,
        }
        assert items[4][0] == "choices"
        assert "usage" not in dict(items)


SSE_INPUTS = [
    b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n',
    b'event: message_start\ndata: {"x":1}\n\nevent: ping\ndata: {}\n\n',
    b": keep-alive\n\ndata: one\ndata: two\n\ndata:no-space\n\n\n\ndata: after blank lines\n\n",
    b"data: crlf\r\n\r\ndata: cr\r\rdata: mixed\r\n\ndata: tail",
    b'id: 7\nretry: 100\ndata: {"with":"id"}\n\ndata: \n\ndata\n\n',
    b'data: {"text":"caf\xc3\xa9 \xe2\x82\xac"}\n\ndata: {"n":2}\n',
    b"event: a\ndata: one\ndata: two\n\nevent:b\ndata: 3\n\nevent: \xc3\xa9\ndata: \n\nevent: c\n\ndata: x\nevent: d\n\n",
    b"event: e\r\ndata: "
    + b"long " * 400
    + b"\r\n\r\nevent: f\rdata: "
    + b"y" * 700
    + b"\n\n: note\nevent: g\ndata: z",
]


def events_of(data: bytes, cuts: list[int]) -> list[Event]:
    from core.sse import SSEDecoder

    decoder = SSEDecoder()
    events: list[Event] = []
    bounds = [0, *cuts, len(data)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        events += decoder.feed(data[start:end])
    return events + decoder.close()


@pytest.mark.parametrize("data", SSE_INPUTS)
def test_sse_decoder_gives_the_same_events_however_the_bytes_are_split(data: bytes) -> None:
    """Whole reads take the decoder's whole-event path; one byte per read takes its line-by-line
    path; every split in between mixes them. All must give the same events."""
    one_by_one = events_of(data, list(range(1, len(data))))
    assert events_of(data, []) == one_by_one
    for step in (2, 3, 5, 7, 11):
        assert events_of(data, list(range(step, len(data), step))) == one_by_one
    assert one_by_one  # (every input has events)


def test_sse_decoder_reads_named_events_and_long_lines_as_the_grammar_says() -> None:
    """Named events (Anthropic's, the Responses API's) and a line longer than a read: the same events
    whole or a byte at a time (an event named with no data line is one, its data empty)."""
    long = b"long " * 400
    for data, expected in (
        (
            SSE_INPUTS[-2],
            [
                Event("a", b"one\ntwo"),
                Event("b", b"3"),
                Event("\u00e9", b""),
                Event("c", b""),
                Event("d", b"x"),
            ],
        ),
        (SSE_INPUTS[-1], [Event("e", long), Event("f", b"y" * 700), Event("g", b"z")]),
    ):
        assert events_of(data, []) == expected
        assert events_of(data, list(range(1, len(data)))) == expected


def test_custom_tool_input_is_kept_for_estimates() -> None:
    # OpenAI custom tools stream free-form ``custom.input``, not ``function.arguments``
    call = '"tool_calls":[{"index":0,"id":"c1","type":"custom","custom":{"name":"run","input":"print(1)"}}]'
    lines = [
        chunk(text('"role":"assistant","content":null')),
        chunk(text(call)),
        chunk(text("", reason='"tool_calls"')),
    ]
    for fast in (False, True):
        assert run(lines, False, fast)[2][2] == "runprint(1)"
