"""``gateway.stream.Shaper.shape``: whatever an adapter's translator gives, the caller gets the chunks in
the promised order and shape (docs/api.md, "Chat completions"). The pass-through of plain OpenAI chunks is compared
with this general path in test_stream_passthrough.py; here the general path alone, on the chunk
shapes the translators produce."""

from __future__ import annotations

import json
from typing import Any

from adapters.base import Call
from core.catalog import Catalog
from core.wire import parse_chat_request
from gateway.stream import Shaper

CATALOG = Catalog.load()
MODEL = "claude/claude-haiku-4-5"  # as the caller wrote it: every chunk echoes it


def shaper(include_usage: bool = False, n: int = 1) -> Shaper:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": n}
    raw, request = parse_chat_request(json.dumps(body).encode())
    call = Call(MODEL, CATALOG.resolve(MODEL), None, raw, request, True, include_usage)  # type: ignore[arg-type]
    return Shaper(call, "chatcmpl-ours", 1800000000)


def chunk(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"choices": list(choices), **extra}


def choice(index: int = 0, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


def shape(s: Shaper, *chunks: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in chunks:
        s.shape(c, out)
    return out


def only(out: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], str | None]]:
    """(index, delta, finish_reason) of each chunk, which always holds exactly one choice."""
    assert all(len(c["choices"]) == 1 for c in out)
    return [
        (c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in out
    ]


def test_every_chunk_has_our_head_and_the_callers_model_in_one_key_order() -> None:
    out = shape(
        shaper(),
        chunk(
            choice(content="Hi"),
            id="msg_up",
            model="claude-haiku-4-5-20251001",
            created=1,
            system_fingerprint="fp_x",
        ),
    )
    assert list(out[0]) == ["id", "object", "created", "model", "choices", "system_fingerprint"]
    assert (out[0]["id"], out[0]["object"], out[0]["created"], out[0]["model"]) == (
        "chatcmpl-ours",
        "chat.completion.chunk",
        1800000000,
        MODEL,
    )
    with_usage = shape(shaper(include_usage=True), chunk(choice(content="Hi"), usage={"prompt_tokens": 1}))
    assert (
        list(with_usage[0])[-1] == "usage" and with_usage[0]["usage"] is None
    )  # usage comes only at the end


def test_the_first_chunk_of_each_choice_says_the_role() -> None:
    s = shaper(n=2)
    out = shape(
        s, chunk(choice(0, content="a")), chunk(choice(1, content="b")), chunk(choice(0, content="c"))
    )
    assert only(out) == [
        (0, {"content": "a", "role": "assistant"}, None),
        (1, {"content": "b", "role": "assistant"}, None),
        (0, {"content": "c"}, None),
    ]
    given = shape(shaper(), chunk(choice(role="assistant", content="")))
    assert only(given) == [(0, {"role": "assistant", "content": ""}, None)]


def test_a_finish_that_comes_with_content_is_split_so_the_finish_chunk_is_empty() -> None:
    out = shape(shaper(), chunk(choice(content="Hello")), chunk(choice(finish="stop", content=" world")))
    assert only(out) == [
        (0, {"content": "Hello", "role": "assistant"}, None),
        (0, {"content": " world"}, None),
        (0, {}, "stop"),
    ]
    bare = shape(shaper(), chunk(choice(content="x")), chunk(choice(finish="length", content="")))
    assert only(bare)[-1] == (0, {}, "length") and len(bare) == 2  # nothing left to say: no split


def test_nothing_follows_a_choices_finish_chunk() -> None:
    s = shaper()
    out = shape(
        s,
        chunk(choice(content="a")),
        chunk(choice(finish="stop")),
        chunk(choice(content="late")),
        chunk(choice(finish="stop")),
    )
    assert [f for _, _, f in only(out)] == [None, "stop"]
    assert set(s.finished) == {0}


def test_several_choices_in_one_chunk_go_out_one_per_chunk() -> None:
    s = shaper(n=2)
    out = shape(
        s,
        chunk(choice(0, content="a"), choice(1, content="b")),
        chunk(choice(0, finish="stop"), choice(1, finish="tool_calls", content="c")),
    )
    assert only(out) == [
        (0, {"content": "a", "role": "assistant"}, None),
        (1, {"content": "b", "role": "assistant"}, None),
        (0, {}, "stop"),
        (1, {"content": "c"}, None),
        (1, {}, "tool_calls"),
    ]
    assert set(s.finished) == {0, 1}


def test_usage_only_chunks_are_held_back_and_the_usage_chunk_comes_last() -> None:
    s = shaper(include_usage=True)
    out = shape(s, chunk(choice(content="a")), chunk(usage={"prompt_tokens": 3}), {"choices": []})
    assert len(out) == 1  # usage-only and empty chunks give nothing here
    usage = s.usage_chunk({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    assert usage == {
        "id": "chatcmpl-ours",
        "object": "chat.completion.chunk",
        "created": 1800000000,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def test_what_was_generated_is_kept_for_an_estimate() -> None:
    s = shaper()
    shape(
        s,
        chunk(choice(reasoning_content="Let me think. ")),
        chunk(choice(content="Calling.")),
        chunk(
            choice(
                tool_calls=[
                    {"index": 0, "id": "t1", "type": "function", "function": {"name": "get", "arguments": ""}}
                ]
            )
        ),
        chunk(choice(tool_calls=[{"index": 0, "function": {"arguments": '{"a":1}'}}])),
        chunk(choice(finish="tool_calls")),
    )
    assert s.generated() == 'Let me think. Calling.get{"a":1}'


def test_text_kept_is_the_text_itself_escapes_and_all_and_a_lone_surrogate_is_a_question_mark() -> None:
    s = shaper()
    shape(
        s,
        chunk(choice(content='a "quoted"\\ line\n')),
        chunk(choice(content="é😀\u2028")),
        chunk(choice(content="\ud800!")),
        chunk(choice(finish="stop")),
    )
    assert s.generated() == 'a "quoted"\\ line\né😀\u2028?!'
