"""p2, Anthropic Messages: the emulator against the official ``anthropic`` SDK (its fidelity), the adapter
on recorded-format fixtures (no network), and the whole path through the gateway with the OpenAI SDK."""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pydantic
import pytest

from adapters.anthropic import AnthropicAdapter, AnthropicStream, finish_reason, tool_choice
from adapters.base import Call, UpstreamStreamError
from core.catalog import Catalog
from core.deployments import Deployment
from core.errors import InvalidRequest, UpstreamError
from core.sse import SSEDecoder
from core.wire import parse_chat_request
from tests.conftest import Stack

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
CATALOG = Catalog.load()
ADAPTER = AnthropicAdapter("anthropic", CATALOG.providers["anthropic"])
PROVIDER = Deployment("anthropic", "http://upstream.test/v1", "sk-ant-test", 5.0, 60.0)
SDK_MODEL = "claude-haiku-4-5"  # the SDK warns (DeprecationWarning) on retiring models such as sonnet 4.5
MODELS = ["anthropic/claude-sonnet-4-5", "claude/claude-haiku-4-5"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    }
]
SIGNATURE = (
    "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"  # tests/fixtures/anthropic/stream_thinking.sse
)
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


# ------------------------------------------------------------------ helpers


def make_call(body: dict[str, Any], model: str = "anthropic/claude-sonnet-4-5") -> Call:
    raw, request = parse_chat_request(json.dumps({"model": model, **body}).encode())
    stream = bool(request.stream)
    include = bool(stream and request.stream_options and request.stream_options.include_usage)
    return Call(model, CATALOG.resolve(model), PROVIDER, raw, request, stream, include)


def sent(body: dict[str, Any], model: str = "anthropic/claude-sonnet-4-5") -> dict[str, Any]:
    return json.loads(ADAPTER.build_request(make_call(body, model)).body)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def translate(data: bytes, reads: list[int] | None = None) -> tuple[list[dict[str, Any]], AnthropicStream]:
    """Feed a raw SSE stream through SSEDecoder (split at ``reads`` byte offsets) and the translator."""
    translator = AnthropicStream()
    decoder = SSEDecoder()
    chunks: list[dict[str, Any]] = []
    bounds = [0, *(reads or []), len(data)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        for event in decoder.feed(data[start:end]):
            chunks.extend(translator.feed(event))
    for event in decoder.close():
        chunks.extend(translator.feed(event))
    return chunks, translator


def deltas(chunks: list[dict[str, Any]], field: str) -> str:
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c.get("choices"))


def emulator_root(stack: Stack) -> str:
    return stack.emulators["anthropic"].base_url.removesuffix("/v1")


def raw_post(stack: Stack, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    url = urlsplit(stack.emulators["anthropic"].base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        conn.request(
            "POST", "/v1/messages", json.dumps(body), {"content-type": "application/json", **headers}
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=emulator_root(stack), api_key=stack.emulators["anthropic"].api_key, max_retries=0
    ) as client:
        yield client


# ------------------------------------------------------------------ the emulator, through the official SDK


def test_sdk_create_text(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=SDK_MODEL,
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello [tokens:6]"}],
    )
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "claude-haiku-4-5-20251001"
    assert [b.type for b in message.content] == ["text"]
    assert len(message.content[0].text.split()) == 6  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens == 6
    assert message.usage.cache_read_input_tokens == 0 and message.usage.service_tier == "standard"


def test_sdk_create_max_tokens_and_stop_sequence(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=SDK_MODEL, max_tokens=3, messages=[{"role": "user", "content": "long [tokens:40]"}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    message = claude.messages.create(
        model=SDK_MODEL,
        max_tokens=64,
        stop_sequences=["three"],
        messages=[{"role": "user", "content": "[echo] one two three four"}],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "three"
    assert message.content[0].text == "one two "  # type: ignore[union-attr]


def test_sdk_tool_use_round_trip(claude: anthropic.Anthropic) -> None:
    tools: Any = [{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}]
    first = claude.messages.create(
        model=SDK_MODEL,
        max_tokens=256,
        tools=tools,
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Seoul?"}],
    )
    assert first.stop_reason == "tool_use"
    [use] = first.content  # forced: no text before the call
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Seoul"}
    assert use.id.startswith("toolu_")
    follow = claude.messages.create(
        model=SDK_MODEL,
        max_tokens=256,
        tools=tools,
        messages=[
            {"role": "user", "content": "Weather in Seoul?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},  # type: ignore[misc]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21°C, clear"}],
            },
        ],
    )
    assert follow.stop_reason == "end_turn"
    assert follow.content[0].text == "The tool returned: 21°C, clear"  # type: ignore[union-attr]


def test_sdk_stream_helper_with_thinking(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=SDK_MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Hi [tokens:5]"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me think." and final.content[0].signature  # type: ignore[union-attr]
    assert final.content[1].text == text and len(text.split()) == 5  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 9 and final.usage.input_tokens > 0


def test_sdk_raw_stream_event_sequence(claude: anthropic.Anthropic) -> None:
    events = list(
        claude.messages.create(
            model=SDK_MODEL,
            max_tokens=64,
            stream=True,
            tools=[{"name": "get_weather", "input_schema": WEATHER}],
            messages=[{"role": "user", "content": "weather? [tool]"}],
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]  # type: ignore[union-attr]
    assert starts == ["text", "tool_use"]  # left to choose, Claude says what it is about to do
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    fragments = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]  # type: ignore[union-attr]
    assert fragments[0] == "" and json.loads("".join(fragments)) == {"city": "Seoul"}
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens > 0  # type: ignore[union-attr]


def test_sdk_stream_helper_tool_use(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=SDK_MODEL,
        max_tokens=64,
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "weather?"}],
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == {"city": "Seoul"} and final.stop_reason == "tool_use"  # type: ignore[union-attr]


def test_sdk_errors(stack: Stack, claude: anthropic.Anthropic) -> None:
    hello = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.OverloadedError) as overloaded:
        claude.messages.create(
            model=SDK_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi [fault:529]"}]
        )
    assert (
        overloaded.value.status_code == 529 and overloaded.value.body["error"]["type"] == "overloaded_error"
    )  # type: ignore[index]
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(
            model=SDK_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi [fault:429]"}]
        )
    assert limited.value.response.headers["retry-after"] == "1"
    with pytest.raises(anthropic.InternalServerError):
        claude.messages.create(
            model=SDK_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi [fault:500]"}]
        )
    with pytest.raises(anthropic.BadRequestError, match="less than or equal to 1"):
        # SDK 2.x no longer types the sampling parameters; the wire (version 2023-06-01) still takes them
        claude.messages.create(model=SDK_MODEL, max_tokens=8, messages=hello, extra_body={"temperature": 1.5})  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="Extra inputs are not permitted"):
        claude.messages.create(
            model=SDK_MODEL, max_tokens=8, messages=hello, extra_body={"stream_options": {}}
        )  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nonexistent-1", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    with anthropic.Anthropic(base_url=emulator_root(stack), api_key="wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model=SDK_MODEL, max_tokens=8, messages=hello)  # type: ignore[arg-type]


def test_sdk_stream_error_event(claude: anthropic.Anthropic) -> None:
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as failed:
        with claude.messages.stream(
            model=SDK_MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi [midfail]"}]
        ) as stream:
            seen.extend(stream.text_stream)
    assert failed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert len(seen) == 1  # one text delta got through before the error


def test_sdk_models_list(claude: anthropic.Anthropic) -> None:
    page = claude.models.list()
    ids = [m.id for m in page.data]
    assert "claude-sonnet-4-5-20250929" in ids and page.has_more is False
    assert page.data[0].created_at.year >= 2024


def test_sdk_prompt_cache_is_written_then_read(claude: anthropic.Anthropic) -> None:
    long = f"{secrets.token_hex(4)} " + "The gateway bills every token exactly. " * 200
    system: Any = [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}]
    first = claude.messages.create(
        model=SDK_MODEL, max_tokens=8, system=system, messages=[{"role": "user", "content": "hi"}]
    )
    second = claude.messages.create(
        model=SDK_MODEL, max_tokens=8, system=system, messages=[{"role": "user", "content": "again"}]
    )
    assert first.usage.cache_creation_input_tokens and first.usage.cache_creation_input_tokens > 1024
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0 and second.usage.input_tokens < 20


def test_emulator_checks_headers_and_validates(stack: Stack) -> None:
    key = stack.emulators["anthropic"].api_key
    ok = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": user("hi")}
    status, out = raw_post(stack, body, ok)
    assert status == 200 and out["content"][0]["type"] == "text"
    status, out = raw_post(stack, body, {"x-api-key": "nope", "anthropic-version": "2023-06-01"})
    assert status == 401 and out["type"] == "error" and out["error"]["type"] == "authentication_error"
    status, out = raw_post(stack, body, {"x-api-key": key})
    assert status == 400 and out["error"] == {
        "type": "invalid_request_error",
        "message": "anthropic-version: header is required",
    }
    bad: list[tuple[dict[str, Any], str]] = [
        ({"model": "claude-sonnet-4-5", "messages": user("hi")}, "max_tokens: Field required"),
        ({**body, "messages": []}, "at least one message"),
        (
            {**body, "messages": [{"role": "system", "content": "x"}]},
            'first message must use the "user" role',
        ),
        ({**body, "messages": [{"role": "tool", "content": "x"}]}, "'user', 'assistant' or 'system'"),
        ({**body, "messages": [{"role": "assistant", "content": "x"}, *user("hi")]}, "first message"),
        (
            {**body, "messages": [*user("hi"), {"role": "assistant", "content": "Sure "}]},
            "trailing whitespace",
        ),
        ({**body, "messages": [*user(""), {"role": "assistant", "content": "x"}]}, "non-empty content"),
        ({**body, "max_tokens": 70000}, "maximum allowed number of output tokens"),
        (
            {
                **body,
                "messages": [
                    *user("hi"),
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
                    },
                    *user("and?"),
                ],
            },
            "without `tool_result`",
        ),
        (
            {
                **body,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}
                ],
            },
            "unexpected `tool_use_id`",
        ),
        (
            {**body, "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "greater than `thinking.budget_tokens`",
        ),
        (
            {
                **body,
                "max_tokens": 2048,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": [
                    *user("hi"),
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
                    },
                ],
            },
            "Expected `thinking` or `redacted_thinking`, but found `tool_use`",
        ),
    ]
    for request, message in bad:
        status, out = raw_post(stack, request, ok)
        assert status == 400 and message in out["error"]["message"], (request, out)


# ------------------------------------------------------------------ the adapter: request translation


def test_request_lifts_system_merges_turns_and_sets_defaults() -> None:
    body = sent(
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hello"},
                {"role": "developer", "content": [{"type": "text", "text": "Answer in Korean."}]},
                {"role": "user", "content": [{"type": "text", "text": "How are you?"}]},
                {"role": "assistant", "content": "Fine."},
                {"role": "assistant", "content": "And you?"},
                {"role": "user", "content": "Good."},
            ],
            "temperature": 1.7,
            "stop": "END",
            "top_p": 0.9,
            "user": "u-1",
        }
    )
    assert body["system"] == [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Answer in Korean."},
    ]
    assert [t["role"] for t in body["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in body["messages"][0]["content"]] == ["Hello", "How are you?"]
    assert [b["text"] for b in body["messages"][1]["content"]] == ["Fine.", "And you?"]
    assert body["model"] == "claude-sonnet-4-5-20250929" and body["max_tokens"] == 4096
    assert body["temperature"] == 1.0 and body["top_p"] == 0.9 and body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "u-1"} and "stream" not in body and "user" not in body


def test_request_headers_and_url() -> None:
    upstream = ADAPTER.build_request(make_call({"messages": user("hi"), "stream": True}))
    assert upstream.url == "http://upstream.test/v1/messages"
    assert (
        upstream.headers["x-api-key"] == "sk-ant-test"
        and upstream.headers["anthropic-version"] == "2023-06-01"
    )
    assert upstream.headers["content-type"] == "application/json" and "Authorization" not in upstream.headers
    assert json.loads(upstream.body)["stream"] is True


@pytest.mark.parametrize(
    ("asked", "model", "expected"),
    [
        ({}, "anthropic/claude-sonnet-4-5", 4096),
        ({"max_tokens": 100}, "anthropic/claude-sonnet-4-5", 100),
        ({"max_completion_tokens": 200, "max_tokens": 100}, "anthropic/claude-sonnet-4-5", 200),
        ({"max_tokens": 50000}, "anthropic/claude-opus-4-1", 32000),  # never above the model's max output
    ],
)
def test_request_max_tokens(asked: dict[str, int], model: str, expected: int) -> None:
    assert sent({"messages": user("hi"), **asked}, model)["max_tokens"] == expected


def test_request_tools_and_tool_round_trip() -> None:
    body = sent(
        {
            "tools": TOOLS,
            "tool_choice": "auto",
            "messages": [
                {"role": "user", "content": "Weather in Seoul and Busan?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
                        },
                        {
                            "id": "call:2/x",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "21°C"},
                {"role": "tool", "tool_call_id": "call:2/x", "content": [{"type": "text", "text": "18°C"}]},
                {"role": "user", "content": "Thanks, and tomorrow?"},
            ],
        }
    )
    assert body["tools"] == [{"name": "get_weather", "input_schema": WEATHER, "description": "Weather now"}]
    assert body["tool_choice"] == {"type": "auto"}
    assistant, results = body["messages"][1], body["messages"][2]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Seoul"}},
            {"type": "tool_use", "id": "call_2_x", "name": "get_weather", "input": {}},
        ],
    }
    assert (
        len(body["messages"]) == 3 and results["role"] == "user"
    )  # both results and the text: one user turn
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "21°C"},
        {"type": "tool_result", "tool_use_id": "call_2_x", "content": [{"type": "text", "text": "18°C"}]},
        {"type": "text", "text": "Thanks, and tomorrow?"},
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            None,
            {"type": "tool", "name": "get_weather"},
        ),
        (None, None, None),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
    ],
)
def test_tool_choice_mapping(choice: Any, parallel: Any, expected: Any) -> None:
    assert tool_choice(choice, parallel) == expected


def test_request_images() -> None:
    body = sent(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"},
                        },
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:application/octet-stream;base64,{PNG}"},
                        },
                    ],
                }
            ]
        }
    )
    blocks = body["messages"][0]["content"]
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    assert blocks[2] == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}
    assert blocks[3]["source"]["media_type"] == "image/png"  # sniffed from the bytes
    with pytest.raises(InvalidRequest, match="not supported"):
        sent(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}
                        ],
                    }
                ]
            }
        )


def test_request_edges() -> None:
    body = sent(
        {
            "messages": [
                {"role": "assistant", "content": "Earlier answer"},
                *user("go on"),
                {"role": "assistant", "content": "The answer is "},
            ]
        }
    )
    assert body["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "."}]}
    assert (
        body["messages"][-1]["content"][-1]["text"] == "The answer is"
    )  # a prefill may not end in whitespace
    assert sent({"messages": [{"role": "system", "content": "Tell a joke"}]})["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Tell a joke"}]}
    ]
    body = sent(
        {
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "Long rules", "cache_control": {"type": "ephemeral"}}
                    ],
                },
                {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
            ]
        }
    )
    assert body["system"] == [{"type": "text", "text": "Long rules", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        sent(
            {
                "messages": [
                    *user("x"),
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    },
                ]
            }
        )
    with pytest.raises(InvalidRequest, match="'n' must be 1"):
        sent({"messages": user("x"), "n": 2})


def test_request_reasoning_effort_becomes_thinking() -> None:
    body = sent({"messages": user("think"), "reasoning_effort": "medium", "temperature": 0.2})
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096} and body["max_tokens"] > 4096
    assert "temperature" not in body
    body = sent({"messages": user("think"), "reasoning_effort": "high", "max_tokens": 2000})
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body["max_tokens"] == 2000
    body = sent({"messages": user("think"), "reasoning_effort": "high"}, "anthropic/claude-haiku-latest")
    assert (
        body["thinking"] == {"type": "enabled", "budget_tokens": 16384}
        and 16384 < body["max_tokens"] <= 64000
    )
    assert "thinking" not in sent({"messages": user("think"), "reasoning_effort": "low", "max_tokens": 500})


# ------------------------------------------------------------------ the adapter: answers from fixtures


def test_parse_tool_use_fixture() -> None:
    out, usage = ADAPTER.parse_response(
        make_call({"messages": user("x")}), (FIXTURES / "message_tool_use.json").read_bytes()
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check the weather in Seoul."
    [call] = choice["message"]["tool_calls"]
    assert call["id"] == "toolu_01VqG2jCdyjoB9HMTFnCKeo2" and call["type"] == "function"
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Seoul",
        "unit": "celsius",
    }
    assert usage is not None and (usage.prompt, usage.completion, usage.cached, usage.cache_write) == (
        4671,
        80,
        3000,
        1200,
    )
    assert out["usage"]["prompt_tokens"] == 4671 and out["usage"]["total_tokens"] == 4751
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 3000, "cache_write_tokens": 1200}


def test_parse_thinking_and_refusal_fixtures() -> None:
    out, usage = ADAPTER.parse_response(
        make_call({"messages": user("x")}), (FIXTURES / "message_thinking.json").read_bytes()
    )
    message = out["choices"][0]["message"]
    assert message["content"] == "안녕하세요! 무엇을 도와드릴까요?" and "tool_calls" not in message
    assert message["reasoning_content"] == "The user wants a short greeting in Korean."
    assert usage is not None and usage.reasoning == 61 and usage.completion == 95
    out, _ = ADAPTER.parse_response(
        make_call({"messages": user("x")}), (FIXTURES / "message_refusal.json").read_bytes()
    )
    assert (
        out["choices"][0]["finish_reason"] == "content_filter"
        and out["choices"][0]["message"]["content"] == "I can"
    )


def test_parse_only_tool_calls_gives_null_content_and_bad_bodies_fail() -> None:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    out, _ = ADAPTER.parse_response(make_call({"messages": user("x")}), json.dumps(body).encode())
    assert out["choices"][0]["message"]["content"] is None
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"
    with pytest.raises(UpstreamError, match="not JSON"):
        ADAPTER.parse_response(make_call({"messages": user("x")}), b"<html>Bad gateway</html>")
    with pytest.raises(UpstreamError, match="overloaded_error"):
        ADAPTER.parse_response(
            make_call({"messages": user("x")}),
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        )


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        (None, "stop"),
    ],
)
def test_stop_reason_mapping(stop: str | None, finish: str) -> None:
    assert finish_reason(stop) == finish


def test_stream_tool_use_fixture() -> None:
    data = (FIXTURES / "stream_tool_use.sse").read_bytes()
    chunks, translator = translate(data, list(range(7, len(data), 97)))  # many odd network reads
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert deltas(chunks, "content") == "I'll look that up."
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert [c["index"] for c in calls if "id" in c] == [0, 1]  # OpenAI index, not the block index (1, 2)
    assert calls[0] == {
        "index": 0,
        "id": "toolu_01Vq",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert "".join(c["function"]["arguments"] for c in calls if c["index"] == 0) == '{"city": "Seoul"}'
    assert "".join(c["function"]["arguments"] for c in calls if c["index"] == 1) == "{}"  # no input at all
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert finishes == ["tool_calls"] and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert translator.finished and translator.usage is not None
    assert (translator.usage.prompt, translator.usage.completion, translator.usage.cached) == (4671, 80, 3000)
    assert (
        translator.usage_raw is not None
        and translator.usage_raw["prompt_tokens_details"]["cache_write_tokens"] == 1200
    )


def test_stream_thinking_fixture() -> None:
    chunks, translator = translate((FIXTURES / "stream_thinking.sse").read_bytes())
    assert deltas(chunks, "reasoning_content") == "The user is asking me to warm up."
    assert deltas(chunks, "content") == "I'm ready to assist you."
    # the block whole, signed, once it ended: what the next turn of a tool loop must send back
    signed = [b for c in chunks for b in c["choices"][0]["delta"].get("thinking_blocks", [])]
    assert signed == [
        {"type": "thinking", "thinking": "The user is asking me to warm up.", "signature": SIGNATURE}
    ]
    assert translator.finished and translator.usage is not None and translator.usage.completion == 41


def test_stream_korean_split_inside_a_character() -> None:
    data = (FIXTURES / "stream_korean.sse").read_bytes()
    at = data.index("서울".encode()) + 1  # inside the 3-byte encoding of 서
    chunks, translator = translate(data, [at])
    assert deltas(chunks, "content") == "안녕하세요, 서울의 날씨는 맑습니다."
    assert translator.usage is not None and (translator.usage.prompt, translator.usage.completion) == (21, 17)
    every_byte, _ = translate(data, list(range(1, len(data))))  # one byte per read
    assert deltas(every_byte, "content") == "안녕하세요, 서울의 날씨는 맑습니다."


def test_stream_in_band_error_and_malformed_event() -> None:
    translator = AnthropicStream()
    decoder = SSEDecoder()
    events = decoder.feed((FIXTURES / "stream_overloaded.sse").read_bytes())
    assert translator.feed(events[0]) and translator.feed(events[1]) == []
    assert translator.feed(events[2])[0]["choices"][0]["delta"] == {"content": "Partial"}
    with pytest.raises(UpstreamStreamError, match="overloaded_error: Overloaded"):
        translator.feed(events[3])
    assert not translator.finished and translator.usage is None
    with pytest.raises(UpstreamStreamError, match="malformed"):
        AnthropicStream().feed(
            SSEDecoder().feed(b'event: content_block_delta\ndata: {"type": "content\n\n')[0]
        )


# ------------------------------------------------------------------ through the gateway, with the OpenAI SDK


@pytest.mark.parametrize("model", MODELS)
def test_gateway_plain_chat(stack: Stack, client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there [tokens:7]"}]
    )
    assert out.model == model and out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert (
        out.choices[0].message.role == "assistant"
        and len((out.choices[0].message.content or "").split()) == 7
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 7
    assert stack.emulator("anthropic").requests[-1]["model"] == CATALOG.resolve(model).upstream


def test_gateway_system_lifted_and_turns_merged(stack: Stack, client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        seed=7,
        response_format={"type": "text"},
        messages=[
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": "Still there?"},
            {"role": "assistant", "content": "Yes."},
            {"role": "assistant", "content": "Ask away."},
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
        ],
    )
    sent_body = stack.emulator("anthropic").requests[
        -1
    ]  # the emulator rejects unknown fields: seed etc. were not sent
    assert sent_body["system"] == [
        {"type": "text", "text": "You are a weather bot."},
        {"type": "text", "text": "Be brief."},
    ]
    assert [m["role"] for m in sent_body["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in sent_body["messages"][0]["content"]] == ["Hi", "Still there?"]
    assert sent_body["max_tokens"] == 4096


def test_gateway_max_tokens_gives_length(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        max_tokens=4,
        messages=[{"role": "user", "content": "long [tokens:50]"}],
    )
    assert (
        out.choices[0].finish_reason == "length"
        and out.usage is not None
        and out.usage.completion_tokens == 4
    )
    assert stack.emulator("anthropic").requests[-1]["max_tokens"] == 4
    chunks = list(
        client.chat.completions.create(
            model="anthropic/claude-sonnet-4-5",
            max_completion_tokens=3,
            stream=True,
            messages=[{"role": "user", "content": "long [tokens:50]"}],
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


def test_gateway_temperature_clamped_and_stop_sequences(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        temperature=1.8,
        stop=["three"],
        messages=[{"role": "user", "content": "[echo] one two three four"}],
    )
    assert out.choices[0].message.content == "one two " and out.choices[0].finish_reason == "stop"
    sent_body = stack.emulator("anthropic").requests[-1]
    assert sent_body["temperature"] == 1.0 and sent_body["stop_sequences"] == ["three"]


def test_gateway_tool_round_trip(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        tools=TOOLS,
        messages=[{"role": "user", "content": "weather? [tool]"}],
    )
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.content == "I'll use get_weather."
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.id.startswith("toolu_") and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Seoul"}  # type: ignore[union-attr]
    follow = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "weather? [tool]"},
            {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
    )
    assert (
        follow.choices[0].message.content == "The tool returned: sunny"
        and follow.choices[0].finish_reason == "stop"
    )
    turns = stack.emulator("anthropic").requests[-1]["messages"]
    assert turns[1]["content"][-1] == {
        "type": "tool_use",
        "id": call.id,
        "name": "get_weather",
        "input": {"city": "Seoul"},
    }
    assert turns[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
    }


def test_gateway_forced_tool_has_null_content(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="claude/claude-haiku-4-5",
        tools=TOOLS,
        tool_choice="required",
        messages=[{"role": "user", "content": "weather?"}],
    )
    assert out.choices[0].message.content is None and out.choices[0].finish_reason == "tool_calls"
    assert stack.emulator("anthropic").requests[-1]["tool_choice"] == {"type": "any"}


def test_gateway_tool_round_trip_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="anthropic/claude-sonnet-4-5",
            tools=TOOLS,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "weather?"}],
        )
    )
    parts = [
        t
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for t in c.choices[0].delta.tool_calls
    ]
    assert (
        parts[0].index == 0 and parts[0].id and parts[0].function and parts[0].function.name == "get_weather"
    )
    arguments = "".join(p.function.arguments or "" for p in parts if p.function)
    assert json.loads(arguments) == {"city": "Seoul"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]
    follow = list(
        client.chat.completions.create(
            model="anthropic/claude-sonnet-4-5",
            tools=TOOLS,
            stream=True,
            messages=[
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": parts[0].id,
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": parts[0].id, "content": "sunny"},
            ],
        )
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in follow if c.choices) == "The tool returned: sunny"
    )


def test_gateway_image_data_url(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            }
        ],
    )
    assert out.choices[0].message.content
    blocks = stack.emulator("anthropic").requests[-1]["messages"][0]["content"]
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }


def test_gateway_korean_streamed_intact_across_split_bytes(client: openai.OpenAI) -> None:
    text = "안녕하세요, 서울의 날씨는 맑습니다. 한국어 스트리밍 시험입니다."
    chunks = list(
        client.chat.completions.create(
            model="claude/claude-haiku-4-5",
            stream=True,
            messages=[{"role": "user", "content": f"[echo][split]{text}"}],
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_gateway_upstream_faults(client: openai.OpenAI) -> None:
    model = "anthropic/claude-sonnet-4-5"
    with pytest.raises(openai.InternalServerError) as overloaded:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi [fault:529]"}])
    assert overloaded.value.status_code == 503
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi [fault:429]"}])
    assert limited.value.response.headers.get("retry-after") == "1"
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi [fault:500]"}])
    assert failed.value.status_code == 502
    with pytest.raises(openai.APIStatusError) as broken:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi [malformed]"}])
    assert broken.value.status_code == 502


@pytest.mark.parametrize("directive", ["[midfail]", "[cut:2]", "[malformed]"])
def test_gateway_stream_fails_mid_stream(client: openai.OpenAI, directive: str) -> None:
    received: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
            model="anthropic/claude-sonnet-4-5",
            stream=True,
            messages=[{"role": "user", "content": f"hi {directive}"}],
        ):
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert received  # the stream had started (role chunk) before the error arrived


def test_gateway_reasoning_content(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5", messages=[{"role": "user", "content": "hi [think]"}]
    )
    message = out.choices[0].message
    assert message.reasoning_content == "Let me think."  # type: ignore[attr-defined]
    assert message.content and "think" not in message.content
    chunks = list(
        client.chat.completions.create(
            model="claude/claude-haiku-4-5",
            stream=True,
            reasoning_effort="low",
            messages=[{"role": "user", "content": "hi [tokens:4]"}],
        )
    )
    assert stack.emulator("anthropic").requests[-1]["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Let me think." and len(content.split()) == 4 and "think" not in content


def test_gateway_reasoning_with_tool_loop(stack: Stack, client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        tools=TOOLS,
        tool_choice="auto",
        reasoning_effort="low",
        messages=[{"role": "user", "content": "weather? [tool]"}],
    )
    assert stack.emulator("anthropic").requests[-1]["thinking"]["type"] == "enabled"
    message = first.choices[0].message
    assert message.reasoning_content == "Let me think." and message.tool_calls  # type: ignore[attr-defined]
    call = message.tool_calls[0]
    follow = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        tools=TOOLS,
        reasoning_effort="low",
        messages=[
            {"role": "user", "content": "weather? [tool]"},
            {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
    )
    assert follow.choices[0].message.content == "The tool returned: sunny"
    assert "thinking" not in stack.emulator("anthropic").requests[-1]  # no signed thinking block to send back


def test_gateway_prompt_cache_usage(client: openai.OpenAI) -> None:
    long = f"{secrets.token_hex(4)} " + "Answer as the gateway's weather bot, politely. " * 150
    messages: Any = [
        {
            "role": "system",
            "content": [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "user", "content": "hi"},
    ]
    first = client.chat.completions.create(model="anthropic/claude-sonnet-4-5", messages=messages)
    second = client.chat.completions.create(model="anthropic/claude-sonnet-4-5", messages=messages)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 1024
    assert (
        first.usage.prompt_tokens_details is not None and first.usage.prompt_tokens_details.cached_tokens == 0
    )
    assert (
        second.usage.prompt_tokens_details is not None
        and second.usage.prompt_tokens_details.cached_tokens > 1024
    )


def test_gateway_rejects_bad_tool_arguments(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not valid JSON"):
        client.chat.completions.create(
            model="anthropic/claude-sonnet-4-5",
            messages=[
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{no"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
        )


class Weather(pydantic.BaseModel):
    city: str
    celsius: int
    sunny: bool


@pytest.mark.parametrize("stream", [False, True])
def test_json_mode_through_a_forced_tool(client: openai.OpenAI, stack: Stack, stream: bool) -> None:
    """``response_format`` for an Anthropic model (it has no JSON mode): the schema goes up as a tool
    the model must call, and its input comes back as the answer's content, finish_reason ``stop``,
    so the SDK's ``parse()`` works as it does with OpenAI. It was ignored: plain text came back."""
    messages = [{"role": "user", "content": "weather in Seoul as JSON"}]
    if stream:
        with client.beta.chat.completions.stream(
            model="anthropic/claude-haiku-4-5",
            messages=messages,  # type: ignore[arg-type]
            response_format=Weather,
        ) as events:
            out = events.get_final_completion()
    else:
        out = client.chat.completions.parse(
            model="anthropic/claude-haiku-4-5",
            messages=messages,  # type: ignore[arg-type]
            response_format=Weather,
        )
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert isinstance(choice.message.parsed, Weather)
    sent = stack.emulator("anthropic").requests[-1]
    assert sent["tool_choice"] == {"type": "tool", "name": "json_response"}
    assert sent["tools"][-1]["input_schema"]["properties"].keys() == {"city", "celsius", "sunny"}
    plain = client.chat.completions.create(
        model="anthropic/claude-haiku-4-5",
        messages=messages,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)


def test_json_mode_through_responses(client: openai.OpenAI) -> None:
    """``text.format`` on /v1/responses reaches an Anthropic model the same way (the translated path
    maps it to ``response_format``): ``responses.parse`` and its stream helper get the object."""
    out = client.responses.parse(
        model="anthropic/claude-haiku-4-5", input="weather as JSON", text_format=Weather
    )
    assert isinstance(out.output_parsed, Weather) and out.status == "completed"
    with client.responses.stream(
        model="anthropic/claude-haiku-4-5", input="weather as JSON", text_format=Weather
    ) as events:
        assert isinstance(events.get_final_response().output_parsed, Weather)
