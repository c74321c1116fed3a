"""POST /v1/chat/completions for the OpenAI-protocol providers, through the real OpenAI SDK."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import Stack, raw_request

OPENAI_PROTOCOL = ["openai/gpt-4o-mini", "upstage/solar-mini", "mistral/mistral-small-latest"]


@pytest.mark.parametrize("model", OPENAI_PROTOCOL)
def test_non_stream_answer_echoes_model(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello there"}])
    assert out.model == model
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


@pytest.mark.parametrize("model", [*OPENAI_PROTOCOL, "claude/claude-haiku-4-5", "gemini/gemini-2.5-flash"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_order(client: openai.OpenAI, model: str, include_usage: bool) -> None:
    """The promised order whatever the provider (docs/api.md, "Chat completions"), and the model id as sent."""
    kwargs = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say something [tokens:5]"}],
            stream=True,
            **kwargs,
        )
    )
    assert len({c.id for c in chunks}) == 1
    assert all(c.model == model for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finish_at = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert len(finish_at) == 1
    finish = chunks[finish_at[0]]
    assert finish.choices[0].finish_reason == "stop"
    assert finish.choices[0].delta.content is None
    text = "".join(c.choices[0].delta.content or "" for c in chunks[: finish_at[0]])
    assert len(text.split()) == 5
    tail = chunks[finish_at[0] + 1 :]
    if include_usage:
        assert len(tail) == 1 and tail[0].choices == [] and tail[0].usage is not None
        assert tail[0].usage.completion_tokens == 5 and tail[0].usage.prompt_tokens > 0
    else:
        assert tail == []
        assert all(c.usage is None for c in chunks)


def test_stream_ends_with_done_on_the_wire(stack: Stack) -> None:
    key = stack.key()
    body = b'{"model": "openai/gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi [tokens:2]"}]}'
    r = raw_request(
        stack,
        "POST",
        "/v1/chat/completions",
        body,
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert r.headers["x-request-id"]


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "long [tokens:50]"}], max_tokens=4
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_reasoning_model_gets_max_completion_tokens(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="openai/o4-mini", messages=[{"role": "user", "content": "think [tokens:30]"}], max_tokens=3
    )
    assert out.choices[0].finish_reason == "length"
    sent = stack.emulator("openai").requests[-1]
    assert sent["model"] == "o4-mini-2025-04-16"
    assert "max_tokens" not in sent and sent["max_completion_tokens"] == 3


def test_unknown_fields_pass_through(stack: Stack, client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        seed=7,
        response_format={"type": "json_object"},
        extra_body={"some_future_field": {"a": [1, 2]}},
    )
    sent = stack.emulator("openai").requests[-1]
    assert sent["seed"] == 7
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["some_future_field"] == {"a": [1, 2]}


def test_mistral_quirks_are_applied(stack: Stack, client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="mistral/mistral-large-latest",
            messages=[{"role": "user", "content": "hi"}],
            seed=3,
            user="u1",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    sent = stack.emulator("mistral").requests[-1]
    assert sent["random_seed"] == 3 and "seed" not in sent
    assert "stream_options" not in sent and "user" not in sent
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_a_conversation_moved_to_mistral_keeps_its_tool_calls(stack: Stack, client: openai.OpenAI) -> None:
    """Mistral accepts only 9-character alphanumeric tool call ids: an OpenAI call's id (call_...) in
    the history is rewritten, the same way in the assistant turn and in the tool message, and the
    same way on every turn; Mistral's own ids pass unchanged."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    first = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "weather? [tool]"}], tools=tools
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.id.startswith("call_")
    history = [
        {"role": "user", "content": "weather? [tool]"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    sent = []
    for _ in range(2):
        follow = client.chat.completions.create(
            model="mistral/mistral-small-latest", messages=history, tools=tools
        )
        assert "sunny" in follow.choices[0].message.content
        sent.append(stack.emulator("mistral").requests[-1]["messages"])
    ids = {sent[0][1]["tool_calls"][0]["id"], sent[0][2]["tool_call_id"], sent[1][1]["tool_calls"][0]["id"]}
    [rewritten] = ids
    assert len(rewritten) == 9 and rewritten.isalnum()
    # Mistral's own ids are kept as they are
    again = client.chat.completions.create(
        model="mistral/mistral-small-latest",
        tools=tools,
        messages=[{"role": "user", "content": "weather? [tool]"}],
    )
    own = again.choices[0].message.tool_calls[0]
    client.chat.completions.create(
        model="mistral/mistral-small-latest",
        tools=tools,
        messages=[
            {"role": "user", "content": "weather? [tool]"},
            {"role": "assistant", "content": None, "tool_calls": [own.model_dump()]},
            {"role": "tool", "tool_call_id": own.id, "content": "rain"},
        ],
    )
    assert stack.emulator("mistral").requests[-1]["messages"][2]["tool_call_id"] == own.id


def test_tools_round_trip(client: openai.OpenAI) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "weather? [tool]"}], tools=tools
    )
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and '"city"' in call.function.arguments
    follow = client.chat.completions.create(
        model="openai/gpt-4o-mini",
        messages=[
            {"role": "user", "content": "weather? [tool]"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
        tools=tools,
    )
    assert "sunny" in follow.choices[0].message.content


CUSTOM_TOOL = {
    "type": "custom",
    "custom": {
        "name": "run_python",
        "description": "Runs Python",
        "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": ".+"}},
    },
}


def test_custom_tools_pass_through_to_openai(stack: Stack, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": "code? [tool]"}],
        tools=[CUSTOM_TOOL],
    )
    call = out.choices[0].message.tool_calls[0]
    assert isinstance(call, openai.types.chat.ChatCompletionMessageCustomToolCall)
    assert (
        call.custom.name == "run_python"
        and call.custom.input
        and out.choices[0].finish_reason == "tool_calls"
    )
    assert stack.emulator("openai").requests[-1]["tools"] == [CUSTOM_TOOL]  # unchanged
    history = [
        {"role": "user", "content": "code? [tool]"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "hello"},
    ]
    follow = client.chat.completions.create(model="openai/gpt-4o-mini", messages=history, tools=[CUSTOM_TOOL])
    assert "hello" in follow.choices[0].message.content
    assert stack.emulator("openai").requests[-1]["messages"][1]["tool_calls"] == [call.model_dump()]
    chunks = list(
        client.chat.completions.create(
            model="openai/gpt-4o-mini",
            messages=[{"role": "user", "content": "code? [tool]"}],
            tools=[CUSTOM_TOOL],
            tool_choice={"type": "custom", "custom": {"name": "run_python"}},
            stream=True,
        )
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].type == "custom" and deltas[0].model_extra["custom"]["name"] == "run_python"  # type: ignore[index]
    assert "".join(d.model_extra["custom"]["input"] for d in deltas) == call.custom.input  # type: ignore[index]


@pytest.mark.parametrize(
    "model", ["anthropic/claude-haiku-4-5", "google/gemini-2.5-flash", "mistral/mistral-small-latest"]
)
def test_custom_tools_refused_for_other_providers(stack: Stack, client: openai.OpenAI, model: str) -> None:
    call = {"id": "call_1", "type": "custom", "custom": {"name": "run_python", "input": "print(1)"}}
    history = [
        {"role": "user", "content": "custom-marker"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
    ]
    for kwargs, param in (({"tools": [CUSTOM_TOOL]}, "tools"), ({"messages": history}, "messages")):
        args = {"model": model, "messages": [{"role": "user", "content": "custom-marker"}], **kwargs}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**args)  # type: ignore[call-overload]
        assert info.value.param == param and info.value.code == "unsupported_tool"  # type: ignore[attr-defined]
        assert "only by OpenAI models" in info.value.message
    upstream = stack.emulator(model.split("/")[0]).requests
    assert not any("custom-marker" in str(r) for r in upstream)


def test_korean_streamed_intact_across_split_bytes(client: openai.OpenAI) -> None:
    text = "안녕하세요, 서울의 날씨는 맑습니다. 한국어 스트리밍 시험입니다."
    for model in ("upstage/solar-pro3", "openai/gpt-4o-mini"):
        chunks = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"[echo][split]{text}"}], stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_reasoning_is_exposed_separately(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="upstage/solar-pro3", messages=[{"role": "user", "content": "hi"}], reasoning_effort="high"
    )
    message = out.choices[0].message
    assert message.reasoning_content == "Let me think."  # type: ignore[attr-defined]
    assert "think" not in (message.content or "")
    out = client.chat.completions.create(
        model="mistral/magistral-medium-latest", messages=[{"role": "user", "content": "hi"}]
    )
    assert out.choices[0].message.reasoning_content == "Let me think."  # type: ignore[attr-defined]
    assert isinstance(out.choices[0].message.content, str)
    chunks = list(
        client.chat.completions.create(
            model="mistral/magistral-medium-latest", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Let me think." and "think" not in content


async def test_async_client_stream(stack: Stack) -> None:
    client = stack.async_client()
    stream = await client.chat.completions.create(
        model="openai/gpt-5-mini", messages=[{"role": "user", "content": "hi [tokens:3]"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert len(text.split()) == 3
    out = await client.chat.completions.create(
        model="upstage/solar-pro4", messages=[{"role": "user", "content": "hi"}]
    )
    assert out.model == "upstage/solar-pro4"
    await client.close()


def test_answer_shape_does_not_tell_the_provider(stack: Stack) -> None:
    """The same top-level keys, in the same order, whichever group served (non-stream and stream)."""
    import json

    key = stack.key()
    shapes: dict[str, set[tuple[str, ...]]] = {"plain": set(), "chunk": set()}
    for model in (
        "openai/gpt-4o-mini",
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "upstage/solar-mini",
        "mistral/mistral-small-latest",
    ):
        for stream in (False, True):
            body = json.dumps(
                {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi [tokens:2]"}]}
            )
            r = raw_request(
                stack,
                "POST",
                "/v1/chat/completions",
                body.encode(),
                {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            if stream:
                for event in r.text.split("\n\n"):
                    if event.startswith("data: {"):
                        shapes["chunk"].add(tuple(json.loads(event[6:]))[:5])
            else:
                shapes["plain"].add(tuple(r.json())[:6])
    assert shapes["plain"] == {("id", "object", "created", "model", "choices", "usage")}
    assert shapes["chunk"] == {("id", "object", "created", "model", "choices")}


def test_sampling_parameters_are_not_sent_to_reasoning_models(stack: Stack, client: openai.OpenAI) -> None:
    """OpenAI's reasoning models (gpt-5*, o-series) answer 400 to sampling parameters that clients
    send to any model; the gateway leaves them out for those models (catalog: reasoning) and sends
    them as given to the others."""
    sampling = {
        "temperature": 0.2,
        "top_p": 0.5,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "stop": ["zz"],
        "logprobs": True,
        "top_logprobs": 2,
    }
    out = client.chat.completions.create(
        model="openai/gpt-5-mini", messages=[{"role": "user", "content": "hi"}], **sampling
    )  # type: ignore[arg-type]
    assert out.choices[0].message.content
    sent = stack.emulator("openai").requests[-1]
    assert not set(sampling) & set(sent)
    client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], **sampling
    )  # type: ignore[arg-type]
    assert {k: stack.emulator("openai").requests[-1][k] for k in sampling} == sampling


def test_every_groups_usage_has_both_details_objects(client: openai.OpenAI) -> None:
    """Client code reads usage.completion_tokens_details.reasoning_tokens: OpenAI always sends both details
    objects, Mistral never does; the gateway's answer has them whatever the provider."""
    for model in ("mistral/mistral-small-latest", "upstage/solar-pro3", "openai/gpt-4o-mini"):
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert answer.usage is not None and answer.usage.completion_tokens_details is not None, model
        assert answer.usage.completion_tokens_details.reasoning_tokens == 0
        assert (
            answer.usage.prompt_tokens_details is not None
            and answer.usage.prompt_tokens_details.cached_tokens == 0
        )
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens_details is not None, model
        assert usage.completion_tokens_details.reasoning_tokens == 0
