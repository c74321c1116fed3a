"""The OpenAI Chat Completions adapter (p1 OpenAI, p4 Upstage, p5 Mistral) on its own: requests built
from the catalog's provider data, answers and streams translated from fixtures (no network). The
whole path through the emulators is in test_chat.py and test_stream_passthrough.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import ADAPTERS
from adapters.base import Call, StreamTranslator, UpstreamStreamError
from adapters.openai import alnum9
from core.catalog import Catalog
from core.deployments import Deployment
from core.errors import UpstreamError
from core.sse import SSEDecoder
from core.wire import TokenUsage, parse_chat_request
from gateway.chat_codec import ChatLeg
from gateway.codec import Cost

FIXTURES = Path(__file__).parent / "fixtures" / "openai"
CATALOG = Catalog.load()


def adapter(prefix: str) -> Any:
    return ADAPTERS["openai"](prefix, CATALOG.providers[prefix])


def make_call(body: dict[str, Any], model: str = "openai/gpt-4o-mini") -> Call:
    raw, request = parse_chat_request(json.dumps({"model": model, **body}).encode())
    stream = bool(request.stream)
    include = bool(stream and request.stream_options and request.stream_options.include_usage)
    provider = Deployment(model.split("/")[0], "http://upstream.test/v1", "sk-test", 5.0, 60.0)
    return Call(model, CATALOG.resolve(model), provider, raw, request, stream, include)


def sent(body: dict[str, Any], model: str = "openai/gpt-4o-mini") -> dict[str, Any]:
    call = make_call(body, model)
    return json.loads(adapter(call.model.provider).build_request(call).body)


HELLO = [{"role": "user", "content": "Hello"}]


def translate(translator: StreamTranslator, data: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    chunks = [chunk for event in decoder.feed(data) for chunk in translator.feed(event)]
    return chunks + [chunk for event in decoder.close() for chunk in translator.feed(event)]


# ------------------------------------------------------------------ requests


def test_request_passes_the_body_through_with_the_upstream_model() -> None:
    call = make_call({"messages": HELLO, "seed": 7, "unknown_field": {"kept": True}}, "openai/gpt-4o")
    upstream = adapter("openai").build_request(call)
    body = json.loads(upstream.body)
    assert body == {
        "model": CATALOG.resolve("openai/gpt-4o").upstream,
        "messages": HELLO,
        "seed": 7,
        "unknown_field": {"kept": True},
    }
    assert upstream.url == "http://upstream.test/v1/chat/completions"
    assert upstream.headers["Authorization"] == "Bearer sk-test" and "Accept" not in upstream.headers
    assert upstream.max_output is None


def test_stream_asks_for_usage_only_where_the_provider_must_be_asked() -> None:
    body = sent({"messages": HELLO, "stream": True, "stream_options": {"include_obfuscation": False}})
    assert body["stream"] is True
    assert body["stream_options"] == {
        "include_obfuscation": False,
        "include_usage": True,
    }  # ours added, theirs kept
    mistral = sent(
        {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}},
        "mistral/mistral-small-latest",
    )
    assert "stream_options" not in mistral  # Mistral always sends usage and takes no stream_options


def test_mistral_fields_are_renamed_and_dropped() -> None:
    body = sent(
        {
            "messages": HELLO,
            "seed": 3,
            "max_completion_tokens": 50,
            "user": "u",
            "logprobs": True,
            "service_tier": "auto",
            "store": False,
        },
        "mistral/mistral-small-latest",
    )
    assert body["random_seed"] == 3 and body["max_tokens"] == 50
    assert not {"seed", "max_completion_tokens", "user", "logprobs", "service_tier", "store"} & set(body)


def test_upstage_drops_parallel_tool_calls() -> None:
    assert "parallel_tool_calls" not in sent(
        {"messages": HELLO, "parallel_tool_calls": False}, "upstage/solar-pro3"
    )


def test_reasoning_models_get_their_cap_field_and_lose_refused_sampling() -> None:
    asked = {"messages": HELLO, "max_tokens": 300, "temperature": 0.2, "top_p": 0.5, "stop": ["x"], "seed": 1}
    body = sent(asked, "openai/o3")
    assert body["max_completion_tokens"] == 300 and "max_tokens" not in body
    assert not {"temperature", "top_p", "stop"} & set(body) and body["seed"] == 1
    plain = sent(asked, "openai/gpt-4o-mini")  # not a reasoning model: everything as sent
    assert plain["max_tokens"] == 300 and plain["temperature"] == 0.2 and plain["stop"] == ["x"]
    both = sent({**asked, "max_completion_tokens": 100}, "openai/o3")
    assert both["max_completion_tokens"] == 100  # the caller's own field wins


def test_foreign_tool_call_ids_become_nine_alphanumerics_for_mistral() -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0fypS1hVXq2w", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                {"id": "Ab3dE6gH9", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_0fypS1hVXq2w", "content": "21"},
        {"role": "tool", "tool_call_id": "Ab3dE6gH9", "content": "18"},
    ]
    body = sent({"messages": messages}, "mistral/mistral-small-latest")
    first, second = (c["id"] for c in body["messages"][1]["tool_calls"])
    assert len(first) == 9 and first.isalnum() and first == alnum9("call_0fypS1hVXq2w")
    assert second == "Ab3dE6gH9"  # Mistral's own ids pass unchanged
    assert [m["tool_call_id"] for m in body["messages"][2:]] == [first, second]  # the pairs still match
    assert (
        sent({"messages": messages})["messages"][1]["tool_calls"][0]["id"] == "call_0fypS1hVXq2w"
    )  # OpenAI: as sent


# ------------------------------------------------------------------ answers


def test_parse_tool_calls_fixture() -> None:
    call = make_call({"messages": HELLO})
    out, usage = adapter("openai").parse_response(call, (FIXTURES / "chat_tool_calls.json").read_bytes())
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == [
        '{"city":"Seoul"}',
        '{"city":"Busan"}',
    ]
    assert usage is not None and (usage.prompt, usage.completion, usage.cached, usage.reasoning) == (
        1082,
        52,
        1024,
        0,
    )
    assert out["system_fingerprint"] == "fp_560af6e559"  # the rest of the answer is kept


def test_parse_mistral_thinking_chunks_and_its_finish_reason() -> None:
    call = make_call({"messages": HELLO}, "mistral/magistral-medium-latest")
    out, usage = adapter("mistral").parse_response(call, (FIXTURES / "mistral_reasoning.json").read_bytes())
    message = out["choices"][0]["message"]
    assert message["content"] == "Hello! How can I help?"
    assert message["reasoning_content"] == "The user greets me. I answer briefly."
    assert out["choices"][0]["finish_reason"] == "length"  # model_length, mapped by the catalog
    assert usage is not None and (usage.prompt, usage.completion) == (9, 32)


def test_parse_upstage_reasoning_field() -> None:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "solar-pro3",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "네.", "reasoning": "생각"},
                "finish_reason": "stop",
            }
        ],
    }
    out, usage = adapter("upstage").parse_response(
        make_call({"messages": HELLO}, "upstage/solar-pro3"), json.dumps(body).encode()
    )
    assert out["choices"][0]["message"] == {
        "role": "assistant",
        "content": "네.",
        "reasoning_content": "생각",
    }
    assert usage is None


def test_parse_refuses_what_is_not_a_chat_completion() -> None:
    call = make_call({"messages": HELLO})
    with pytest.raises(UpstreamError, match="not JSON"):
        adapter("openai").parse_response(call, b"<html>502</html>")
    with pytest.raises(UpstreamError, match="unexpected answer shape"):
        adapter("openai").parse_response(call, b'{"object": "chat.completion"}')
    with pytest.raises(UpstreamStreamError, match="ended the answer with an error"):
        adapter("mistral").parse_response(
            call, b'{"choices": [{"index": 0, "message": {}, "finish_reason": "error"}]}'
        )


# ------------------------------------------------------------------ streams


def test_mistral_stream_fixture() -> None:
    call = make_call({"messages": HELLO, "stream": True}, "mistral/magistral-medium-latest")
    translator = adapter("mistral").stream(call)
    chunks = translate(translator, (FIXTURES / "mistral_reasoning_stream.sse").read_bytes())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert (
        "".join(d.get("reasoning_content") or "" for d in deltas) == "The user greets me. I answer briefly."
    )
    assert "".join(d.get("content") or "" for d in deltas) == "Hello! How can I help?"
    assert all(isinstance(d.get("content", ""), str) for d in deltas)  # never a list of chunks
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert translator.finished and translator.usage is not None and translator.usage.completion == 32
    assert not translator.passthrough  # finish reasons to map: no chunk passes through untouched


def test_upstage_stream_fixture() -> None:
    call = make_call(
        {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}, "upstage/solar-pro3"
    )
    translator = adapter("upstage").stream(call)
    chunks = translate(translator, (FIXTURES / "upstage_reasoning_stream.sse").read_bytes())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d.get("reasoning_content") for d in deltas] == [None, "사용자가 인사합니다.", None, None]
    assert not any("reasoning" in d for d in deltas)
    assert translator.usage is not None and (translator.usage.completion, translator.usage.reasoning) == (
        19,
        11,
    )
    assert translator.usage_raw is not None and translator.usage_raw["total_tokens"] == 31
    assert translator.finished


def test_openai_stream_passes_through_and_fails_in_band() -> None:
    translator = adapter("openai").stream(make_call({"messages": HELLO, "stream": True}))
    assert translator.passthrough  # plain chunks may go to the caller as bytes (gateway/stream.py)
    error = b'data: {"error": {"message": "The server had an error", "type": "server_error"}}\n\n'
    with pytest.raises(UpstreamStreamError, match="failed mid-stream: The server had an error"):
        translate(translator, error)
    flat = b'data: {"object": "error", "message": "Service unavailable", "type": "internal_error"}\n\n'
    with pytest.raises(UpstreamStreamError, match="Service unavailable"):
        translate(adapter("mistral").stream(make_call({"messages": HELLO, "stream": True})), flat)
    with pytest.raises(UpstreamStreamError, match="malformed"):
        translate(
            adapter("openai").stream(make_call({"messages": HELLO, "stream": True})),
            b'data: {"id": "x", "cho\n\n',
        )


def test_alnum9_is_stable_and_keeps_valid_ids() -> None:
    assert alnum9("toolu_01A09q90qw90lq917835lq9") == alnum9("toolu_01A09q90qw90lq917835lq9")
    assert alnum9("call_a") != alnum9("call_b")
    assert alnum9("abcDEF123") == "abcDEF123"
    assert alnum9("abc-EF123") != "abc-EF123"  # nine, but not all alphanumerics


# ------------------------------------------------------------------ plain answers (left as bytes)

_counts = st.one_of(st.none(), st.integers(-3, 10**12), st.floats(0, 100), st.text(max_size=3), st.booleans())
_details = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "cached_tokens": _counts,
            "cache_write_tokens": _counts,
            "reasoning_tokens": _counts,
            "reasoning_tokens_estimated": st.one_of(st.booleans(), st.none(), st.just("yes")),
            "audio_tokens": _counts,
        },
    ),
)
_usages = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": _counts,
        "completion_tokens": _counts,
        "total_tokens": _counts,
        "prompt_cache_hit_tokens": _counts,
        "prompt_tokens_details": _details,
        "completion_tokens_details": _details,
        "cost": st.floats(0, 1),
    },
)
_messages = st.fixed_dictionaries(
    {"role": st.just("assistant")},
    optional={
        "content": st.one_of(st.none(), st.text(max_size=20), st.just([{"type": "text", "text": "hi"}])),
        "refusal": st.none(),
        "annotations": st.just([]),
        "tool_calls": st.one_of(
            st.none(),
            st.just([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
        ),
    },
)
_choices = st.lists(
    st.fixed_dictionaries(
        {
            "index": st.integers(0, 3),
            "message": _messages,
            "logprobs": st.none(),
            "finish_reason": st.sampled_from(["stop", "length", "tool_calls", None]),
        }
    ),
    min_size=1,
    max_size=3,
)
_answers = st.fixed_dictionaries(
    {"choices": _choices, "usage": st.one_of(_usages, st.none())},
    optional={
        "id": st.text(max_size=8),
        "object": st.just("chat.completion"),
        "model": st.text(max_size=8),
        "created": st.one_of(st.integers(0, 2**40), st.none()),
        "service_tier": st.just("default"),
        "system_fingerprint": st.text(max_size=8),
        "x_extra": st.dictionaries(st.text(max_size=3), st.integers()),
    },
)


def _priced(leg: ChatLeg, payload: bytes) -> tuple[dict[str, Any], Any]:
    answer = leg.answer(payload)
    if answer.usage is not None:
        leg.price(answer.body, COST)
    body = json.loads(msgspec.json.encode(answer.body))
    body.pop("id"), body.pop("created")  # (a new id each time; the clock's second if the upstream gave none)
    return body, answer.usage


COST = Cost("0.000123", msgspec.Raw(b"0.000123"), TokenUsage(prompt=1, completion=2))


@settings(max_examples=400, deadline=None)
@given(answer=_answers, pretty=st.booleans())
def test_a_plain_answer_left_as_bytes_is_the_answer_parsed(answer: dict[str, Any], pretty: bool) -> None:
    """The chat endpoint's short way (``plain_answer``: the upstream's fields kept as bytes, ``cost``
    spliced into its usage) gives what the long way gives, whenever it is taken, and it is taken for
    the common answer (text choices, a usage without cost)."""
    payload = json.dumps(answer, indent=1 if pretty else None).encode()
    call = make_call({"messages": HELLO})
    openai = adapter("openai")
    plain = openai.plain_answer(call, payload)
    try:
        expected = _priced(ChatLeg(call, openai, False), payload)
    except UpstreamError:
        assert plain is None
        return
    assert _priced(ChatLeg(call, openai, True), payload) == expected
    usage = answer["usage"]
    common = (
        isinstance(usage, dict)
        and usage
        and "cost" not in usage
        and all(
            not isinstance(c["message"].get("content"), list) and c["message"].get("tool_calls") is None
            for c in answer["choices"]
        )
    )
    assert (plain is not None) == bool(common)


def test_providers_that_rename_or_map_take_the_long_way() -> None:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
    payload = json.dumps(body).encode()
    assert adapter("openai").plain_answer(make_call({"messages": HELLO}), payload) is not None
    for prefix, model in (("mistral", "mistral/magistral-medium-latest"), ("upstage", "upstage/solar-pro3")):
        spec = CATALOG.providers[prefix]
        assert (
            spec.reasoning_field or spec.finish_reasons
        )  # (Solar's reasoning field, Mistral's model_length)
        assert adapter(prefix).plain_answer(make_call({"messages": HELLO}, model), payload) is None
