"""One conformance suite over all five provider groups, driven by the OpenAI SDK through the gateway:
changing only ``model`` switches provider and the shape of the answer stays the same."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import ONE_PER_PROVIDER, Stack

MODELS = ONE_PER_PROVIDER
IMAGE_MODELS = {
    "openai/gpt-4o-mini",
    "openai/gpt-5-mini",
    "anthropic/claude-haiku-4-5",
    "google/gemini-2.5-flash",
    "mistral/mistral-small-latest",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

pytestmark = pytest.mark.parametrize("model", MODELS)


def _text(chunks: list) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_plain_chat(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}])
    assert out.object == "chat.completion" and out.model == model and out.id.startswith("chatcmpl-")
    assert len(out.choices) == 1 and out.choices[0].index == 0
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_system_prompt_and_multi_turn(client: openai.OpenAI, model: str) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "[echo]Second question"},
    ]
    out = client.chat.completions.create(model=model, messages=messages)
    assert out.choices[0].message.content == "Second question"
    assert out.usage is not None and out.usage.prompt_tokens >= 8  # the whole conversation was sent


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_order(client: openai.OpenAI, model: str, include_usage: bool) -> None:
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say it [tokens:6]"}], stream=True, **extra
        )
    )
    assert {c.id for c in chunks} == {chunks[0].id} and all(c.model == model for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[finishes[0]].choices[0].finish_reason == "stop"
    assert chunks[finishes[0]].choices[0].delta.content is None
    assert len(_text(chunks).split()) == 6
    tail = chunks[finishes[0] + 1 :]
    if include_usage:
        assert len(tail) == 1 and tail[0].choices == [] and tail[0].usage.completion_tokens >= 6  # type: ignore[union-attr]
    else:
        assert tail == [] and all(c.usage is None for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_gives_length(client: openai.OpenAI, model: str, stream: bool) -> None:
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "long [tokens:40]"}], max_tokens=5, stream=stream
    )
    if stream:
        chunks = list(out)  # type: ignore[arg-type]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert len(_text(chunks).split()) == 5
    else:
        assert out.choices[0].finish_reason == "length"  # type: ignore[union-attr]
        assert out.usage.completion_tokens == 5  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(client: openai.OpenAI, model: str, stream: bool) -> None:
    messages: list = [{"role": "user", "content": "Weather in Seoul? [tool]"}]
    out = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=stream)
    if stream:
        chunks = list(out)  # type: ignore[arg-type]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["tool_calls"]
        calls: dict[int, dict] = {}
        for c in chunks:
            for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or tc.id
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert list(calls) == [0]
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        assert out.choices[0].finish_reason == "tool_calls"  # type: ignore[union-attr]
        tc = out.choices[0].message.tool_calls[0]  # type: ignore[union-attr, index]
        call_id, name, arguments = tc.id, tc.function.name, tc.function.arguments
    assert call_id and name == "get_weather"
    assert json.loads(arguments) == {"city": "Seoul"}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21C"},
    ]
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert "sunny, 21C" in (final.choices[0].message.content or "")
    assert final.choices[0].finish_reason == "stop"


def test_image_message(client: openai.OpenAI, model: str) -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": PNG}},
        ],
    }
    if model in IMAGE_MODELS:
        out = client.chat.completions.create(model=model, messages=[message])
        assert out.choices[0].message.content
    else:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model, messages=[message])
        assert info.value.code == "image_input_unsupported"  # type: ignore[attr-defined]


def test_korean_split_inside_characters(client: openai.OpenAI, model: str) -> None:
    text = "한국어 응답을 스트리밍합니다: 가나다라마바사 아자차카타파하."
    chunks = list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"[echo][split]{text}"}], stream=True
        )
    )
    assert _text(chunks) == text


@pytest.mark.parametrize(
    ("fault", "status"),
    [("[fault:429]", 429), ("[fault:500]", 502), ("[fault:503]", 503), ("[fault:529]", 503)],
)
def test_upstream_errors(client: openai.OpenAI, model: str, fault: str, status: int) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": fault}])
    assert info.value.status_code == status
    body = info.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}


def test_stream_cut_off_midway(stack: Stack, client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, stream=True, messages=[{"role": "user", "content": "long [tokens:30] [cut:3]"}]
    )
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            seen.append(chunk)
    assert all(not (c.choices and c.choices[0].finish_reason) for c in seen)
