"""POST /v1/responses for the five provider groups, through the real OpenAI SDK : p1 passes the
Responses API through to OpenAI (emulated), the others are translated to chat and back."""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from typing import Any

import msgspec
import openai
import pytest

from adapters.openai_responses import ResponsesRelay
from billing.pricing import cost
from billing.store import UsageRecord
from core import inputs
from core.catalog import NANO
from core.errors import InvalidRequest
from core.inputs import decode_object
from core.kept import Kept, Shared
from core.sse import Event
from core.wire import TokenUsage, Tool
from gateway import responses_translate
from gateway.responses_events import EventSynth
from gateway.responses_translate import encoded_tools, shell, to_chat
from tests.conftest import ONE_PER_PROVIDER, Stack, break_off, http_post, raw_request

MODELS = ONE_PER_PROVIDER
TRANSLATED = MODELS[1:]
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]


def _png() -> str:
    """A valid 1×1 PNG as a data: URL."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    raw += chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _records(stack: Stack, group: str, n: int) -> list[UsageRecord]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = stack.run(stack.store.usage(group=group, limit=100))
        if len(records) >= n:
            return records  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError(f"expected {n} usage records in {group}")


def _billed(stack: Stack, group: str, model: str, usage: Any, stream: bool) -> UsageRecord:
    """The call's one usage record: endpoint responses, the response's tokens, their exact price."""
    [record] = _records(stack, group, 1)
    assert (
        record.endpoint == "responses"
        and record.stream is stream
        and record.status == "ok"
        and record.usage_exact
    )
    assert (record.prompt_tokens, record.completion_tokens) == (usage.input_tokens, usage.output_tokens)
    assert record.reasoning_tokens == usage.output_tokens_details.reasoning_tokens
    prices = stack.gateway.catalog.resolve(model).prices
    tokens = TokenUsage(
        prompt=usage.input_tokens,
        completion=usage.output_tokens,
        cached=usage.input_tokens_details.cached_tokens,
    )
    assert record.credits == cost(prices, tokens) > 0
    g = stack.run(stack.store.get_group(group))
    assert g.spent == record.credits and g.reserved == 0
    return record


def _group_client(stack: Stack) -> tuple[str, openai.OpenAI]:
    group = stack.group(10)
    return group, stack.client(stack.key(group=group))


# ------------------------------------------------------------------ the five groups


@pytest.mark.parametrize("model", MODELS)
def test_create(stack: Stack, model: str) -> None:
    group, client = _group_client(stack)
    out = client.responses.create(model=model, input="Say hello [tokens:5]", instructions="Be brief.")
    assert out.id.startswith("resp_") and out.object == "response" and out.model == model
    assert out.status == "completed" and out.error is None and out.created_at > 0
    [message] = [item for item in out.output if item.type == "message"]
    assert message.role == "assistant" and message.status == "completed" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and len(out.output_text.split()) == 5
    assert out.usage is not None and out.usage.output_tokens >= 5 and out.usage.input_tokens > 0
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    _billed(stack, group, model, out.usage, stream=False)


@pytest.mark.parametrize("model", MODELS)
def test_stream_event_order(stack: Stack, model: str) -> None:
    group, client = _group_client(stack)
    events = list(client.responses.create(model=model, input="Count [tokens:6]", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.usage is None and events[0].response.status == "in_progress"  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert len(text.split()) == 6
    assert [e.text for e in events if e.type == "response.output_text.done"] == [text]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and final.status == "completed" and final.model == model
    assert final.id == events[0].response.id  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.output_tokens >= 6
    _billed(stack, group, model, final.usage, stream=True)


@pytest.mark.parametrize("model", MODELS)
def test_stream_helper(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input="Tell me [tokens:4]") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) and len(deltas) >= 1 and len(final.output_text.split()) == 4
    assert final.usage is not None and final.usage.output_tokens >= 4 and final.model == model


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", MODELS)
def test_function_tool_round_trip(client: openai.OpenAI, model: str, stream: bool) -> None:
    question = {"role": "user", "content": "What is the weather in Seoul? [tool]"}
    if stream:
        with client.responses.stream(model=model, input=[question], tools=TOOLS) as events:  # type: ignore[arg-type]
            arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
            first = events.get_final_response()
    else:
        first = client.responses.create(model=model, input=[question], tools=TOOLS)  # type: ignore[arg-type]
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] and call.call_id
    assert first.output[-1] == call  # any text (Claude says what it does) comes before the call
    if stream:
        assert arguments == call.arguments
    follow_up = [
        question,
        *first.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'},
    ]
    final = client.responses.create(model=model, input=follow_up, tools=TOOLS)  # type: ignore[arg-type]
    assert "sunny" in final.output_text and final.status == "completed"


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_3_tool_loop_hands_back_the_thought_signature(
    stack: Stack, client: openai.OpenAI, stream: bool
) -> None:
    """Gemini 3 refuses a turn whose earlier function call lost its thoughtSignature: the function_call
    item carries it (extra_content.google.thought_signature, as chat tool calls do) and the gateway puts
    it back on the call when the item comes back as input, streamed or not."""
    model = "google/gemini-3-pro-preview"
    question = {"role": "user", "content": "What is the weather in Seoul? [tool]"}
    if stream:
        with client.responses.stream(model=model, input=[question], tools=TOOLS) as events:  # type: ignore[arg-type]
            added = [e.item for e in events if e.type == "response.output_item.added"]
            first = events.get_final_response()
        assert any(getattr(item, "extra_content", None) for item in added)
    else:
        first = client.responses.create(model=model, input=[question], tools=TOOLS)  # type: ignore[arg-type]
    [call] = [item for item in first.output if item.type == "function_call"]
    signature = call.extra_content["google"]["thought_signature"]  # type: ignore[attr-defined]
    assert signature
    follow_up = [
        question,
        *first.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'},
    ]
    final = client.responses.create(model=model, input=follow_up, tools=TOOLS)  # type: ignore[arg-type]
    assert "sunny" in final.output_text and final.status == "completed"
    sent = stack.emulator("google").requests[-1]["contents"]
    [part] = [p for c in sent for p in c["parts"] if "functionCall" in p]
    assert part["thoughtSignature"] == signature


def test_tool_choice_named_function_forces_the_call(stack: Stack, client: openai.OpenAI) -> None:
    out = client.responses.create(
        model="mistral/mistral-small-latest",
        input="weather?",
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert [item.type for item in out.output] == ["function_call"]
    sent = stack.emulator("mistral").requests[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["tools"][0] == {
        "type": "function",
        "function": {k: v for k, v in TOOLS[0].items() if k != "type"},
    }


@pytest.mark.parametrize(
    "model",
    [
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "mistral/mistral-small-latest",
        "openai/gpt-5-mini",
        "openai/gpt-4o-mini",
    ],
)
def test_image_input(stack: Stack, client: openai.OpenAI, model: str) -> None:
    for url in (_png(), "https://example.com/cat.png"):
        image = {"type": "input_image", "image_url": url, "detail": "auto"}
        out = client.responses.create(
            model=model,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is in this picture?"}, image],
                }
            ],
        )  # type: ignore[list-item]
        assert out.output_text and out.status == "completed"
        sent = json.dumps(stack.emulator(model.split("/")[0]).requests[-1])
        assert (url.split(",")[1] if url.startswith("data:") else url) in sent


def test_image_refused_for_a_text_only_model(stack: Stack, client: openai.OpenAI) -> None:
    before = len(stack.emulator("upstage").requests)
    for model in ("upstage/solar-mini", "mistral/mistral-large-latest"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(
                model=model,
                input=[
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": _png(), "detail": "auto"}],
                    }
                ],
            )
        assert info.value.code == "image_input_unsupported" and info.value.param == "input"  # type: ignore[attr-defined]
        assert "does not accept image input" in info.value.message
    assert len(stack.emulator("upstage").requests) == before


# ------------------------------------------------------------------ failures


@pytest.mark.parametrize("directive", ["[midfail]", "[cut:2]", "[malformed]"])
@pytest.mark.parametrize("model", MODELS)
def test_upstream_failure_mid_stream(stack: Stack, model: str, directive: str) -> None:
    group, client = _group_client(stack)
    events = list(client.responses.create(model=model, input=f"go {directive} [tokens:20]", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None and failed.error.message
    assert failed.id == events[0].response.id and failed.model == model  # type: ignore[union-attr]
    assert not any(e.type == "response.completed" for e in events)
    with client.responses.stream(model=model, input=f"again {directive} [tokens:20]") as stream:
        with pytest.raises(RuntimeError, match="response.completed"):
            stream.get_final_response()  # the SDK reports it: there is no completed response
    records = _records(stack, group, 2)
    assert all(r.status == "error" and r.endpoint == "responses" and r.error for r in records)
    g = stack.run(stack.store.get_group(group))
    assert g.reserved == 0 and g.spent == sum(r.credits for r in records)


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"])
def test_upstream_http_errors_cost_nothing(stack: Stack, model: str) -> None:
    group, client = _group_client(stack)
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model=model, input="[fault:429]")
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=model, input="[fault:500]", stream=True)
    records = _records(stack, group, 2)
    assert all(r.status == "error" and r.credits == 0 for r in records)


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "google/gemini-2.5-flash"])
def test_402_before_any_upstream_call(stack: Stack, model: str) -> None:
    group = stack.group(0.0001)
    with pytest.raises(openai.APIStatusError) as info:
        stack.client(stack.key(group=group)).responses.create(
            model=model, input="hi", max_output_tokens=16_000
        )
    assert info.value.status_code == 402 and info.value.code == "insufficient_credits"  # type: ignore[attr-defined]
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert [(r.status, r.credits, r.error_code, r.endpoint) for r in records] == [
        ("rejected", 0, "insufficient_credits", "responses")
    ]


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "upstage/solar-mini"])
def test_client_disconnect_mid_stream_is_billed(stack: Stack, model: str) -> None:
    group = stack.group(1)
    key = stack.key(group=group)
    body = json.dumps({"model": model, "stream": True, "input": "long [tokens:300] [delay:20]"}).encode()
    break_off(stack.port, http_post(key, body, "/v1/responses"), b"response.output_text.delta\ndata: ", 10)
    [record] = _records(stack, group, 1)
    assert record.status == "interrupted" and not record.usage_exact and record.endpoint == "responses"
    assert 8 <= record.completion_tokens < 300 and record.prompt_tokens > 0 and record.credits > 0
    g = stack.run(stack.store.get_group(group))
    assert g.reserved == 0 and g.spent == record.credits and g.balance + g.spent == NANO


# ------------------------------------------------------------------ what is refused, what passes


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
    ],
)
def test_hosted_tools_are_left_out_for_translated_models_and_named(
    stack: Stack, client: openai.OpenAI, tool: dict[str, Any]
) -> None:
    """A tool only OpenAI runs (Codex sends web_search on every call) is left out of another provider's
    call, and named in x-router-omitted-tools, the second call with the same tools too (their
    decoding and reading kept); forced by tool_choice, it is a 400 naming tool_choice."""
    for _ in range(2):
        raw = client.responses.with_raw_response.create(
            model="anthropic/claude-haiku-4-5", input="search the web", tools=[tool, *TOOLS]
        )  # type: ignore[list-item]
        assert raw.headers["x-router-omitted-tools"] == tool["type"] and raw.parse().output_text
        assert [t["name"] for t in stack.emulator("anthropic").requests[-1]["tools"]] == ["get_weather"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="anthropic/claude-haiku-4-5",
            input="search the web",
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": tool["type"]},
        )  # type: ignore[misc,arg-type]
    assert tool["type"] in info.value.message and info.value.param == "tool_choice"  # type: ignore[attr-defined]


def test_builtin_tool_passes_through_for_openai(stack: Stack, client: openai.OpenAI) -> None:
    out = client.responses.create(model="openai/gpt-4o-mini", input="news?", tools=[{"type": "web_search"}])
    assert out.output_text and stack.emulator("openai").requests[-1]["tools"] == [{"type": "web_search"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation", "conv_1"),
        ("truncation", "auto"),
        ("top_logprobs", 3),
    ],
)
def test_untranslatable_features_are_400_naming_them(client: openai.OpenAI, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="mistral/mistral-small-latest", input="hi", extra_body={field: value})
    assert field in info.value.message and info.value.param.startswith(field)  # type: ignore[union-attr]


def test_previous_response_id_and_store(stack: Stack, client: openai.OpenAI) -> None:
    # every group: the gateway stores the response (store true or absent) and chains it itself
    for model in MODELS:
        first = client.responses.create(model=model, input="Remember 7.", store=True)
        assert first.store is True
        second = client.responses.create(model=model, input="Which number?", previous_response_id=first.id)
        assert second.previous_response_id == first.id and second.store is True
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens  # the chained context was counted
        out = client.responses.create(model=model, input="hi", store=False)
        assert out.store is False
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="openai/gpt-4o-mini", input="x", previous_response_id="resp_unknown")
    assert info.value.code == "response_not_found"  # type: ignore[attr-defined]


def test_background_refusals_come_before_anything_is_sent(stack: Stack) -> None:
    # background with stream (not offered) or without store (nothing to poll): 400, nothing reserved or sent
    group, client = _group_client(stack)
    for extra, param in (({"stream": True}, "stream"), ({"store": False}, "store")):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="openai/gpt-4o-mini", input="bg-marker", background=True, **extra)
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error"
        assert info.value.param == param and "background" in info.value.message
    assert not any("bg-marker" in json.dumps(r) for r in stack.emulator("openai").requests)
    records = stack.run(stack.store.usage(group=group, limit=10))  # recorded as refused, nothing charged
    assert sorted((r.status, r.credits) for r in records) == [("rejected", 0), ("rejected", 0)]
    g = stack.run(stack.store.get_group(group))
    assert g.reserved == 0 and g.spent == 0
    assert client.responses.create(model="openai/gpt-4o-mini", input="hi", background=False).output_text


def test_chat_only_and_responses_only_models(stack: Stack, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="openai/gpt-4o-search-preview", input="news")
    assert info.value.code == "unsupported_model_endpoint"  # type: ignore[attr-defined]
    out = client.responses.create(model="openai/gpt-5-codex", input="write code [tokens:3]")
    assert out.model == "openai/gpt-5-codex" and len(out.output_text.split()) == 3
    assert [item.type for item in out.output] == ["reasoning", "message"]
    assert out.usage is not None and out.usage.output_tokens_details.reasoning_tokens > 0
    assert stack.emulator("openai").requests[-1]["model"] == "gpt-5-codex"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="openai/gpt-5-codex", messages=[{"role": "user", "content": "x"}]
        )


def test_key_allow_list_applies(stack: Stack) -> None:
    client = stack.client(stack.key(models=["anthropic/claude-haiku-4-5"]))
    assert client.responses.create(model="anthropic/claude-haiku-4-5", input="x").output_text
    for model in ("openai/gpt-4o-mini", "google/gemini-2.5-flash"):
        with pytest.raises(openai.PermissionDeniedError):
            client.responses.create(model=model, input="x")


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI) -> None:
    for model, cap in (("anthropic/claude-haiku-4-5", 4), ("openai/gpt-4o-mini", 16)):
        out = client.responses.create(model=model, input="long [tokens:50]", max_output_tokens=cap)
        assert out.status == "incomplete" and out.incomplete_details is not None
        assert out.incomplete_details.reason == "max_output_tokens" and out.output[-1].status == "incomplete"
        assert out.usage is not None and out.usage.output_tokens == cap
        events = list(
            client.responses.create(model=model, input="long [tokens:50]", max_output_tokens=cap, stream=True)
        )
        assert events[-1].type == "response.incomplete"
        assert events[-1].response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


# ------------------------------------------------------------------ what goes upstream, what comes back


def test_p1_passes_through_with_the_upstream_model_name(stack: Stack, client: openai.OpenAI) -> None:
    client.responses.create(
        model="openai/gpt-4o-mini",
        input=[{"role": "developer", "content": "terse"}, {"role": "user", "content": "hi"}],
        metadata={"k": "v"},
        temperature=0.5,
    )
    sent = stack.emulator("openai").requests[-1]
    assert (
        sent["model"] == "gpt-4o-mini-2024-07-18"
        and sent["metadata"] == {"k": "v"}
        and sent["temperature"] == 0.5
    )
    assert sent["input"] == [{"role": "developer", "content": "terse"}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stream", [False, True])
def test_p1_reasoning_model_sampling_options_are_left_out(
    stack: Stack, client: openai.OpenAI, stream: bool
) -> None:
    """OpenAI's reasoning models refuse temperature and top_p on the Responses API too (the emulator
    answers 400 as OpenAI does): the pass-through leaves them out for a reasoning model, as for chat."""
    running = stack.emulators["openai"]
    upstream = openai.OpenAI(base_url=running.base_url, api_key=running.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        upstream.responses.create(model="o3", input="hi", temperature=0.2)
    assert refused.value.param == "temperature"
    upstream.close()
    options: dict[str, Any] = {"temperature": 0.2, "top_p": 0.9, "top_logprobs": 2}
    if stream:
        with client.responses.stream(model="openai/o3", input="hi", **options) as events:
            answer = events.get_final_response()
    else:
        answer = client.responses.create(model="openai/o3", input="hi", **options)
    assert answer.status == "completed" and answer.output_text
    assert not set(options) & set(stack.emulator("openai").requests[-1])


def test_translation_reaches_the_chat_upstream(stack: Stack, client: openai.OpenAI) -> None:
    client.responses.create(
        model="mistral/mistral-small-latest",
        instructions="Answer in Korean.",
        max_output_tokens=50,
        temperature=0.3,
        top_p=0.9,
        text={"format": {"type": "json_object"}},
        input=[
            {"role": "developer", "content": "Be terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
            {"role": "user", "content": "again"},
        ],
    )  # type: ignore[arg-type]
    sent = stack.emulator("mistral").requests[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Answer in Korean."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"]) == (50, 0.3, 0.9)
    assert sent["response_format"] == {"type": "json_object"} and sent["model"] == "mistral-small-2506"


def test_wire_format_of_the_stream(stack: Stack) -> None:
    key = stack.key()
    for model in ("openai/gpt-4o-mini", "google/gemini-2.5-flash"):
        body = json.dumps({"model": model, "stream": True, "input": "hi [tokens:3]"}).encode()
        r = raw_request(
            stack,
            "POST",
            "/v1/responses",
            body,
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        blocks = [b for b in r.text.split("\n\n") if b]
        assert "[DONE]" not in r.text
        for block in blocks:
            event_line, data_line = block.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert event_line == f"event: {data['type']}"
            if "response" in data:
                assert data["response"]["model"] == model  # the caller's id, in every event that carries it
        assert json.loads(blocks[-1].split("\n")[1][6:])["type"] == "response.completed"


def test_korean_and_reasoning_through_translation(client: openai.OpenAI) -> None:
    text = "안녕하세요, 서울의 날씨는 맑습니다."
    out = client.responses.create(
        model="upstage/solar-pro3", input=f"[echo][split]{text}", reasoning={"effort": "high"}
    )
    assert out.output_text == text
    assert [item.type for item in out.output] == ["reasoning", "message"]
    assert out.output[0].content[0].text == "Let me think."  # type: ignore[union-attr, index]
    with client.responses.stream(
        model="upstage/solar-pro3", input=f"[echo][split]{text}", reasoning={"effort": "high"}
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert final.output_text == text and "response.reasoning_text.delta" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


def test_bad_bodies(stack: Stack, client: openai.OpenAI) -> None:
    key = stack.key()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for body, param in (
        (b"{", None),
        (b'{"input": "x"}', "model"),
        (b'{"model": "anthropic/claude-haiku-4-5"}', "input"),
        (b'{"model": "upstage/solar-mini", "input": "x", "temperature": 9}', "temperature"),
        (b'{"model": "upstage/solar-mini", "input": [{"type": "computer_call_output"}]}', "input[0]"),
        (b'{"model": "upstage/solar-mini", "input": "x", "max_output_tokens": 0}', "max_output_tokens"),
    ):
        r = raw_request(stack, "POST", "/v1/responses", body, headers)
        assert r.status == 400 and r.json()["error"]["param"] == param, r.text
    r = raw_request(stack, "POST", "/v1/responses", b'{"model": "nobody/model", "input": "x"}', headers)
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):  # the upstream's own validation, passed on
        client.responses.create(model="openai/gpt-4o-mini", input="x", max_output_tokens=5)


# ------------------------------------------------------------------ the pure parts


def test_to_chat_merges_calls_into_the_assistant_turn() -> None:
    chat = to_chat(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "two cities"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "a",
                    "output": [{"type": "input_text", "text": "1"}],
                },
                {"type": "function_call_output", "call_id": "b", "output": "2"},
            ],
            "tools": TOOLS,
            "tool_choice": "required",
            "stream": True,
        }
    )
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ],
    }
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    assert chat["tools"][0]["function"]["name"] == "get_weather" and chat["tool_choice"] == "required"
    assert chat["stream_options"] == {"include_usage": True}
    with pytest.raises(InvalidRequest, match="input_file"):
        to_chat(
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}
        )


def test_a_set_of_tools_seen_before_is_translated_once_and_answers_as_the_first_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent sends the same tools every turn: the second call's chat tools and names are the first's
    (the same objects), a tool_choice forcing a hosted tool is still a 400, and the sets kept stay
    within their bytes (the oldest go first)."""
    tools = [
        {
            "type": "namespace",
            "name": "fs",
            "tools": [{"type": "function", "name": "read", "parameters": {}}],
        },
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"},
    ]
    body: dict[str, Any] = {"model": "m", "input": "q", "tools": tools}
    first = to_chat(body, tools=encoded_tools(body))
    again = to_chat(json.loads(json.dumps(body)), tools=encoded_tools(body))
    assert again["tools"] is first["tools"] and first["tools"] == to_chat(body)["tools"]
    assert [t["function"]["name"] for t in first["tools"]] == ["fs__read", "apply_patch"]
    forced = {**body, "tool_choice": {"type": "web_search"}}
    with pytest.raises(InvalidRequest, match="tool_choice forces"):
        to_chat(forced, tools=encoded_tools(forced))
    assert shell(body, "m", encoded_tools(body))["tools"] == msgspec.Raw(
        json.dumps(tools, separators=(",", ":")).encode()
    )
    monkeypatch.setattr(responses_translate, "_KNOWN", Kept(8 * 400))
    for n in range(20):
        other = {**body, "tools": [{"type": "function", "name": f"f{n}", "description": "x" * 200}]}
        to_chat(other, tools=encoded_tools(other))
    kept = responses_translate._KNOWN
    assert 0 < len(kept.values) < 20 and sum(len(raw) for raw, _ in kept.values) == kept.size <= 8 * 400


@pytest.mark.parametrize("model", TRANSLATED)
def test_a_kept_set_of_tools_reaches_the_provider_as_a_chat_call_with_them_does(
    stack: Stack, client: openai.OpenAI, model: str
) -> None:
    """A translated call's tools are a kept set (core.kept.Shared): the chat pipeline's structs and the
    adapter's tools, as JSON, are made once for the set and kept on it. The provider gets them the same
    on the set's first call and on the next, and as a chat call with the same tools sends them."""
    provider = model.split("/")[0]
    lookup = {
        "type": "function",
        "name": f"lookup_{provider}",
        "description": "Looks a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
    tools = [*TOOLS, lookup]  # (a set of this test's own)
    emulator = stack.emulator(provider)
    sent = []
    for _ in range(2):
        client.responses.create(model=model, input="hi [tokens:2]", tools=tools)  # type: ignore[arg-type]
        sent.append(emulator.requests[-1]["tools"])
    as_chat = [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in tools
    ]
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi [tokens:2]"}], tools=as_chat
    )  # type: ignore[arg-type]
    assert sent[0] == sent[1] == emulator.requests[-1]["tools"] and len(json.dumps(sent[0])) > 200
    kept = [
        chat
        for (chat, _), _ in responses_translate._KNOWN.values.values()
        if any(tool["function"]["name"] == lookup["name"] for tool in chat)
    ]
    assert len(kept) == 1 and type(kept[0]) is Shared
    adapter = {"anthropic": "anthropic", "google": "gemini"}.get(provider)
    made = kept[0].made[Tool].made[adapter].made.get("json") if adapter else kept[0].made.get("json")
    assert made is not None  # (what the adapter sent the provider, made once: its tools' JSON)


def test_a_kept_set_of_tools_goes_to_openai_as_sent(stack: Stack, client: openai.OpenAI) -> None:
    """On a model whose provider speaks the Responses API the tools pass through: the decoded set's JSON
    is made once (core.kept.as_sent) and the provider gets the tools as sent, on each turn."""
    lookup = {
        "type": "function",
        "name": "lookup_openai_native",
        "description": "Looks a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
    tools = [lookup, *TOOLS, {"type": "web_search"}]
    emulator = stack.emulator("openai")
    sent = []
    for _ in range(2):
        client.responses.create(model="openai/gpt-4o-mini", input="hi [tokens:2]", tools=tools)  # type: ignore[arg-type]
        sent.append(emulator.requests[-1]["tools"])
    assert sent[0] == sent[1] == tools
    kept = [v for v, _ in inputs._kept.values.values() if isinstance(v, list) and v and v[0] == lookup]
    assert len(kept) == 1 and type(kept[0]) is Shared and kept[0].made.get("json") is not None


def test_a_text_delta_written_as_its_frame_is_what_the_event_would_encode_to() -> None:
    """EventSynth writes a message's text deltas straight as SSE frames: each is byte for byte the frame
    of the event dict it stands for (quotes, escapes and non-ASCII included)."""
    from core.sse import frame_event
    from gateway.responses_codec import frames

    body = shell({"model": "x/y", "input": "q", "tools": TOOLS}, "x/y")
    synth = EventSynth(body)
    [opening] = synth.start()
    snapshot = msgspec.json.decode(msgspec.json.encode(body))
    assert opening == b"".join(
        frame_event(kind, msgspec.json.encode({"type": kind, "sequence_number": n, "response": snapshot}))
        for n, kind in enumerate(("response.created", "response.in_progress"))
    )
    piece = 'say "hi"\n\u00e9\u2028 \\ \U0001f600'
    opened = synth.feed({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    events = synth.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
    assert [type(e) for e in opened] == [dict, dict, bytes] and len(events) == 1
    item = synth.output[0]["id"]
    expected = {
        "type": "response.output_text.delta",
        "sequence_number": 5,
        "item_id": item,
        "output_index": 0,
        "content_index": 0,
        "delta": piece,
        "logprobs": [],
    }
    assert events[0] == frame_event(expected["type"], msgspec.json.encode(expected))
    assert frames([*opened, *events]).count(b"event: ") == 4
    finished = synth.finish()[-1]["response"]
    assert finished["output"][0]["content"][0]["text"] == "a" + piece


def _same_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A response with its item ids, made-up call ids and sealed state in place of what is random."""

    def same(call_id: str) -> str:
        return "made" if call_id.startswith("call_") else call_id

    output = []
    for i, item in enumerate(response["output"]):
        item = {**item, "id": f"{item['type']}-{i}"}
        if "call_id" in item:
            item["call_id"] = same(item["call_id"])
        if "encrypted_content" in item:
            state = json.loads(item["encrypted_content"])
            item["encrypted_content"] = {**state, "c": [same(c) for c in state["c"]]}
        output.append(item)
    return {**response, "output": output, "completed_at": 0}


@pytest.mark.parametrize("summary", [False, True])
def test_a_whole_answer_is_the_response_its_stream_would_end_with(summary: bool) -> None:
    """from_completion builds the Response without making events, by the rules EventSynth follows: for
    every kind of answer it is the response the same answer streamed ends with."""
    from gateway.responses_events import Options
    from gateway.responses_translate import ToolName, from_completion

    names = {"agents__spawn": ToolName("spawn", "agents"), "patch": ToolName("patch", custom=True)}
    how = Options(summary=summary, names=names, seal=lambda state: json.dumps(state, sort_keys=True))
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 3}}
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "agents__spawn", "arguments": '{"a": 1}'}},
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "patch", "arguments": '{"input": "*** x"}'},
            "extra_content": {"google": {"thought_signature": "sig"}},
        },
        {"type": "function", "function": {"name": "plain"}},
    ]
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Hello there."},
        {"role": "assistant", "content": ""},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Think.",
            "tool_calls": calls,
            "thinking_blocks": [{"type": "thinking", "thinking": "Think.", "signature": "s"}],
        },
        {"role": "assistant", "content": "Calling.", "tool_calls": calls[:1]},
        {"role": "assistant", "reasoning_content": "Only thought."},
        {"role": "assistant", "content": [{"type": "text", "text": "a list"}], "tool_calls": "not a list"},
        {},
    ]
    for message in messages:
        for reason in ("stop", "length", "content_filter", "tool_calls", None):
            for given in (usage, None):
                body = shell({"model": "x/y", "input": "q", "instructions": "Be brief."}, "x/y")
                whole = from_completion(
                    {"choices": [{"index": 0, "message": message, "finish_reason": reason}], "usage": given},
                    body,
                    how,
                )
                synth = EventSynth(body, how)
                delta = {k: v for k, v in message.items() if k != "tool_calls"}
                if isinstance(message.get("tool_calls"), list):
                    delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
                synth.feed(
                    {"choices": [{"index": 0, "delta": delta, "finish_reason": reason}], "usage": given}
                )
                streamed = synth.finish()[-1]["response"]
                assert _same_ids(whole) == _same_ids(streamed), (message, reason)
                assert whole["status"] == (
                    "incomplete" if reason in ("length", "content_filter") else "completed"
                )


def test_event_synth_parallel_calls_and_failure() -> None:
    synth = EventSynth(shell({"model": "x/y", "input": "q"}, "x/y"))
    synth.start()
    events: list[Any] = []
    for call in (
        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}},
        {"index": 0, "function": {"arguments": ": 1}"}},
        {"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{}"}},
    ):
        events += synth.feed(
            {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
        )
    events += synth.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    events += synth.feed({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
    events += synth.finish()
    kinds = [e["type"] for e in events]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.added", 1)
    final = events[-1]["response"]
    assert [(i["call_id"], i["arguments"]) for i in final["output"]] == [("c1", '{"a": 1}'), ("c2", "{}")]
    assert final["usage"]["total_tokens"] == 12 and final["status"] == "completed"
    broken = EventSynth(shell({"model": "x/y", "input": "q"}, "x/y"))
    broken.start()
    broken.feed({"choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]})
    [failed] = broken.feed({"error": {"message": "boom", "code": "upstream_error"}})
    assert failed["type"] == "response.failed" and failed["response"]["error"] == {
        "code": "server_error",
        "message": "boom",
    }
    assert failed["response"]["output"][0]["status"] == "incomplete"
    assert failed["response"]["output"][0]["content"][0]["text"] == "partial" and broken.finish() == []


def test_the_echoed_tools_pass_through_as_their_bytes() -> None:
    """A native Response's echo of the request's tools and instructions goes back as the upstream wrote
    it, never decoded (Codex's 30 tools are thousands of objects, in the answer and in three events of
    a stream); the rest is read as before."""
    from adapters.openai_responses import parse_response
    from core.errors import UpstreamError

    tools = b'[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}]'
    response = (
        b'{"id":"resp_1","object":"response","model":"gpt-4o-mini-2024-07-18","instructions":"Be \\"brief\\".",'
        b'"tools":' + tools + b',"output":[],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}'
    )
    data, usage = parse_response(response, "openai/gpt-4o-mini", "openai", {"store": False})
    assert type(data["tools"]) is msgspec.Raw and bytes(data["tools"]) == tools and usage is not None
    assert (data["model"], data["store"], data["output"], usage.prompt) == (
        "openai/gpt-4o-mini",
        False,
        [],
        3,
    )
    assert msgspec.json.decode(msgspec.json.encode(data))["instructions"] == 'Be "brief".'
    relay = ResponsesRelay("openai/gpt-4o-mini", "openai")
    [frame] = relay.feed(
        Event(
            "response.created",
            b'{"type":"response.created","sequence_number":0,"response":' + response + b"}",
        )
    )
    assert tools in frame and frame.count(b'"model":"openai/gpt-4o-mini"') == 1
    assert (
        relay.feed(
            Event(
                "response.completed",
                b'{"type":"response.completed","sequence_number":1,"response":' + response + b"}",
            )
        )
        == []
    )
    assert (
        relay.terminal is not None
        and bytes(relay.terminal["response"]["tools"]) == tools
        and relay.usage.prompt == 3
    )
    odd = ResponsesRelay("openai/gpt-4o-mini", "openai")  # a "response" that is no object passes as it came
    assert odd.feed(Event("x", b'{"type":"x","response":"text"}')) == [
        b'event: x\ndata: {"type":"x","response":"text"}\n\n'
    ]
    with pytest.raises(UpstreamError, match="malformed"):
        odd.feed(Event("x", b'{"type":"x","response":{'))
    named = ResponsesRelay("openai/gpt-4o-mini", "openai")  # an error named by its event line alone
    assert named.feed(Event("error", b'{"message":"overloaded","code":"server_error"}'))[0].startswith(
        b"event: error\n"
    )
    assert named.error == "overloaded"
    with pytest.raises(UpstreamError, match="unexpected answer shape"):
        parse_response(b'["response"]', "openai/gpt-4o-mini", "openai")
    with pytest.raises(UpstreamError, match="not JSON"):
        parse_response(b'{"object":"response"', "openai/gpt-4o-mini", "openai")


def test_relay_rewrites_the_model_and_ends_a_broken_stream() -> None:
    relay = ResponsesRelay("openai/gpt-4o-mini", "openai")
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_1", "model": "gpt-4o-mini-2024-07-18", "object": "response", "output": []},
    }
    [frame] = relay.feed(Event("response.created", json.dumps(created).encode()))
    assert b'"model":"openai/gpt-4o-mini"' in frame and frame.startswith(b"event: response.created\n")
    relay.feed(
        Event(
            "response.output_text.delta",
            b'{"type":"response.output_text.delta","sequence_number":1,"delta":"Hi"}',
        )
    )
    relay.feed(
        Event(
            "error",
            b'{"type":"error","sequence_number":2,"error":{"message":"overloaded","code":"server_error"}}',
        )
    )
    assert not relay.finished and relay.error == "overloaded" and relay.generated_text() == "Hi"
    tail = relay.fail("ended early")
    assert tail["type"] == "response.failed" and tail["sequence_number"] == 3
    assert tail["response"]["id"] == "resp_1" and tail["response"]["error"]["message"] == "overloaded"
    assert relay.feed(Event(None, b"[DONE]")) == []


def test_relay_reads_usage_from_the_terminal_event() -> None:
    relay = ResponsesRelay("openai/o3", "openai")
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 0},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 4},
        "total_tokens": 110,
    }
    done = {
        "type": "response.completed",
        "sequence_number": 5,
        "response": {"id": "resp_1", "object": "response", "model": "o3-2025-04-16", "usage": usage},
    }
    assert relay.feed(Event("response.completed", json.dumps(done).encode())) == []  # held for its owner
    assert relay.finished and relay.error is None and relay.terminal is not None
    assert relay.terminal["response"]["model"] == "openai/o3"  # the caller's model id
    assert relay.usage == TokenUsage(prompt=100, completion=10, cached=40, reasoning=4)


def test_the_tools_echoed_are_the_bytes_the_caller_sent_when_they_are_on_one_line() -> None:
    """encoded_tools takes the tools as the caller sent them (decode_object gives their bytes), not an
    encode of the decoded list; tools broken over lines are encoded again, since the Response object
    that echoes them goes out in SSE data lines."""
    tools = [
        {"type": "function", "name": "f\u00e9", "parameters": {"type": "object", "properties": {}}},
        {"type": "web_search"},
    ]
    body = {"model": "x/y", "input": "q", "tools": tools, "metadata": {"tools": [1]}}
    spaced = json.dumps(body).encode()  # (the SDK's separators: ", " and ": "; non-ASCII escaped)
    decoded, sent = decode_object(spaced, "tools")
    assert decoded == body and sent is not None and sent in spaced and json.loads(sent) == tools
    assert encoded_tools(body, sent) is sent
    decoded, lines = decode_object(json.dumps(body, indent=2).encode(), "tools")
    assert decoded == body and lines is not None and b"\n" in lines
    assert encoded_tools(body, lines) == encoded_tools(body) == msgspec.json.encode(tools)
    assert encoded_tools({**body, "tools": []}, b"[]") is None
