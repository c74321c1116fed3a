"""Structured output on every group, and the OpenAI-flavour emulator's tool_choice, n and [cut], Mistral's
tool calls and Anthropic's reasoning count: through the gateway with the OpenAI SDK."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from tests.conftest import ONE_PER_PROVIDER, Stack


class Place(BaseModel):
    city: str
    country_code: str


class Forecast(BaseModel):
    """Nested objects, an enum, arrays of numbers and of objects, an optional field."""

    place: Place
    sky: Literal["clear", "cloudy", "rain"]
    highs: list[int]
    stops: list[Place]
    confidence: float
    note: str | None


ASK = [{"role": "user", "content": "Forecast for Seoul, please."}]


@pytest.mark.parametrize("model", ONE_PER_PROVIDER)
def test_parse_gets_an_object_of_the_schema_on_every_group(stack: Stack, model: str) -> None:
    client = stack.client()
    out = client.chat.completions.parse(model=model, messages=ASK, response_format=Forecast)  # type: ignore[arg-type]
    parsed = out.choices[0].message.parsed
    assert (
        isinstance(parsed, Forecast)
        and parsed.sky in ("clear", "cloudy", "rain")
        and parsed.highs
        and parsed.stops
    )
    with client.chat.completions.stream(model=model, messages=ASK, response_format=Forecast) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_completion().choices[0].message.parsed
    assert streamed == parsed


@pytest.mark.parametrize("model", ONE_PER_PROVIDER)
def test_responses_parse_gets_an_object_of_the_schema_on_every_group(stack: Stack, model: str) -> None:
    out = stack.client().responses.parse(model=model, input="Forecast for Seoul.", text_format=Forecast)
    assert isinstance(out.output_parsed, Forecast)


@pytest.mark.parametrize("model", ONE_PER_PROVIDER)
def test_json_mode_answers_a_real_json_object(stack: Stack, model: str) -> None:
    out = stack.client().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give me JSON."}],
        response_format={"type": "json_object"},
    )
    value = json.loads(out.choices[0].message.content or "")
    assert isinstance(value, dict) and value


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.mark.parametrize(
    "model", ["openai/gpt-4o-mini", "upstage/solar-pro3", "mistral/mistral-small-latest"]
)
def test_tool_choice_none_calls_no_tool(stack: Stack, model: str) -> None:
    client = stack.client()
    asked = [{"role": "user", "content": "Weather in Seoul? [tool]"}]
    called = client.chat.completions.create(model=model, messages=asked, tools=TOOLS)  # type: ignore[arg-type]
    assert called.choices[0].message.tool_calls  # the directive calls a tool when allowed ...
    out = client.chat.completions.create(model=model, messages=asked, tools=TOOLS, tool_choice="none")  # type: ignore[arg-type]
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content  # ... not with "none"


def test_n_gives_n_choices_stream_and_not(stack: Stack) -> None:
    client = stack.client()
    out = client.chat.completions.create(model="openai/gpt-4o-mini", messages=ASK, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.message.content for c in out.choices}) == 3
    texts: dict[int, str] = {}
    finished = []
    for chunk in client.chat.completions.create(model="openai/gpt-4o-mini", messages=ASK, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished.append(choice.index)
    assert sorted(finished) == [0, 1] and all(texts.values()) and texts[0] != texts[1]


def test_a_non_stream_answer_cut_mid_body_is_a_502(stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        stack.client().chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi [cut:1]"}]
        )
    assert info.value.status_code == 502 and info.value.body["code"] == "upstream_error"  # type: ignore[index]


def test_mistral_tool_calls_have_their_type_and_validate(stack: Stack) -> None:
    """Mistral answers tool calls without ``type`` and with an ``index``: the caller gets OpenAI's shape."""
    client = stack.client()
    asked = [{"role": "user", "content": "Weather in Seoul? [tool]"}]
    raw = client.chat.completions.with_raw_response.create(
        model="mistral/mistral-small-latest", messages=asked, tools=TOOLS
    )  # type: ignore[arg-type]
    body = json.loads(raw.text)
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function" and "index" not in call
    assert ChatCompletion.model_validate(body).choices[0].message.tool_calls[0].type == "function"  # type: ignore[index]
    with client.chat.completions.stream(
        model="mistral/mistral-small-latest", messages=asked, tools=TOOLS
    ) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].type == "function"  # type: ignore[index]
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"city": "Seoul"}  # type: ignore[index]


def test_anthropic_reasoning_tokens_are_an_estimate_not_a_zero(stack: Stack) -> None:
    """Anthropic counts thinking inside output_tokens: the share of thinking is estimated and flagged."""
    client = stack.client()
    asked = [{"role": "user", "content": "Think first. [think]"}]
    out = client.chat.completions.create(model="anthropic/claude-sonnet-4-6", messages=asked)
    details = out.usage.completion_tokens_details  # type: ignore[union-attr]
    assert out.choices[0].message.model_extra and out.choices[0].message.model_extra.get("reasoning_content")
    assert details is not None and 0 < (details.reasoning_tokens or 0) < out.usage.completion_tokens  # type: ignore[union-attr]
    assert details.model_extra == {"reasoning_tokens_estimated": True}
    usage = [
        c.usage
        for c in client.chat.completions.create(
            model="anthropic/claude-sonnet-4-6",
            messages=asked,
            stream=True,
            stream_options={"include_usage": True},
        )
        if c.usage
    ]
    assert usage and usage[0].completion_tokens_details.reasoning_tokens == details.reasoning_tokens  # type: ignore[union-attr]
    plain = client.chat.completions.create(
        model="anthropic/claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
    )
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0  # type: ignore[union-attr]
    assert not plain.usage.completion_tokens_details.model_extra  # type: ignore[union-attr]  # no thinking: exact 0
