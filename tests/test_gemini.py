"""The Gemini provider (p3, ``google/`` and ``gemini/``): the emulator against the official google-genai
SDK (its fidelity), the adapter on recorded wire fixtures (no network), and the whole path through the
gateway with the OpenAI SDK."""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from adapters.base import Call, UpstreamStreamError
from adapters.gemini import GeminiAdapter, GeminiStream, finish_reason, usage_from_gemini
from core.catalog import Catalog
from core.deployments import Deployment
from core.errors import InvalidRequest, RateLimited, UpstreamError, UpstreamUnavailable
from core.sse import Event, SSEDecoder
from core.wire import parse_chat_request
from tests.conftest import Stack

FIXTURES = Path(__file__).parent / "fixtures" / "gemini"
CATALOG = Catalog.load()
ADAPTER = GeminiAdapter("google", CATALOG.providers["google"])
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}, "hour24": {"type": "boolean"}},
        },
    },
}
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n fake image bytes").decode()
KOREAN = "안녕하세요, 서울의 날씨는 맑습니다. 한국어 스트리밍 시험입니다."


def make_call(body: dict[str, Any], model: str = "google/gemini-2.5-flash") -> Call:
    raw, request = parse_chat_request(json.dumps({"model": model, **body}).encode())
    provider = Deployment(
        prefix="google",
        base_url="http://gemini.test/v1beta",
        api_key="g-key",
        connect_timeout=1,
        read_timeout=1,
    )
    stream = bool(request.stream)
    return Call(model, CATALOG.resolve(model), provider, raw, request, stream, False)


def sent(call: Call) -> dict[str, Any]:
    return json.loads(ADAPTER.build_request(call).body)


def feed_all(translator: GeminiStream, reads: list[bytes]) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    chunks: list[dict[str, Any]] = []
    for data in reads:
        for event in decoder.feed(data):
            chunks += translator.feed(event)
    for event in decoder.close():
        chunks += translator.feed(event)
    return chunks


# ------------------------------------------------------------------ adapter: request translation


def test_request_translates_the_conversation() -> None:
    call = make_call(
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hi"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": PNG}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/cat.webp?x=1"}},
                    ],
                },
                {"role": "developer", "content": [{"type": "text", "text": "Answer in Korean."}]},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
                        },
                        {
                            "id": "call_0123456789abcdef01234567",
                            "type": "function",
                            "function": {"name": "get_time", "arguments": ""},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "12:00"},
                {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 21}'},
                {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": ""},
            ],
            "tools": [WEATHER, TIME],
        }
    )
    body = sent(call)
    assert body["systemInstruction"] == {"parts": [{"text": "You are terse."}, {"text": "Answer in Korean."}]}
    user, model, results = body["contents"]
    assert user["role"] == "user" and user["parts"][:2] == [{"text": "Hi"}, {"text": "What is this?"}]
    assert user["parts"][2] == {"inlineData": {"mimeType": "image/png", "data": PNG.split(",", 1)[1]}}
    assert user["parts"][3] == {
        "fileData": {"mimeType": "image/webp", "fileUri": "https://example.com/cat.webp?x=1"}
    }
    assert model == {
        "role": "model",
        "parts": [
            {"text": "Let me check."},
            {"functionCall": {"name": "get_weather", "args": {"city": "Seoul"}, "id": "call_abc"}},
            {"functionCall": {"name": "get_time", "args": {}}},
        ],
    }  # a synthesised id is not sent back
    assert results == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "get_time", "response": {"result": "12:00"}}},
            {"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}, "id": "call_abc"}},
            {"text": "Thanks"},
        ],
    }  # tool results and the user text after them: one user turn
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Current weather",
                    "parametersJsonSchema": WEATHER["function"]["parameters"],
                },
                {"name": "get_time", "parametersJsonSchema": TIME["function"]["parameters"]},
            ]
        }
    ]
    assert "toolConfig" not in body and "generationConfig" not in body


def test_request_generation_config_and_url() -> None:
    call = make_call(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 1.5,
            "top_p": 0.9,
            "max_tokens": 100,
            "max_completion_tokens": 50,
            "stop": "END",
            "n": 2,
            "seed": 7,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stream": True,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
        }
    )
    request = ADAPTER.build_request(call)
    assert request.url == "http://gemini.test/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert request.headers["x-goog-api-key"] == "g-key" and "Authorization" not in request.headers
    assert json.loads(request.body)["generationConfig"] == {
        "temperature": 1.5,
        "topP": 0.9,
        "maxOutputTokens": 50,
        "stopSequences": ["END"],
        "candidateCount": 2,
        "seed": 7,
        "presencePenalty": 0.5,
        "frequencyPenalty": -0.5,
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
    }
    plain = make_call(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10**6,
            "stop": ["a", "b"],
            "response_format": {"type": "json_object"},
            "reasoning_effort": "low",
        }
    )
    assert ADAPTER.build_request(plain).url.endswith("/models/gemini-2.5-flash:generateContent")
    assert sent(plain)["generationConfig"] == {
        "maxOutputTokens": 65536,
        "stopSequences": ["a", "b"],
        "responseMimeType": "application/json",
        "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True},
    }
    level = make_call(
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"},
        "google/gemini-3-pro-preview",
    )
    assert sent(level)["generationConfig"]["thinkingConfig"] == {
        "thinkingLevel": "HIGH",
        "includeThoughts": True,
    }
    off = make_call({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"})
    assert sent(off)["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 0, "includeThoughts": False}
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"mode": "AUTO"}),
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        (
            {"type": "function", "function": {"name": "get_time"}},
            {"mode": "ANY", "allowedFunctionNames": ["get_time"]},
        ),
    ],
)
def test_request_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    call = make_call(
        {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, TIME], "tool_choice": choice}
    )
    assert sent(call)["toolConfig"] == {"functionCallingConfig": expected}


@pytest.mark.parametrize(
    "messages",
    [
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                ],
            }
        ],
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
                ],
            }
        ],
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "never-made", "content": "x"}],
        [{"role": "system", "content": "only a system prompt"}],
        [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}],
            }
        ],
    ],
)
def test_request_rejects_what_gemini_cannot_take(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(InvalidRequest):
        ADAPTER.build_request(make_call({"messages": messages}))


# ------------------------------------------------------------------ adapter: answers from recorded fixtures


def test_parse_text_with_thoughts_and_usage() -> None:
    data, usage = ADAPTER.parse_response(
        make_call({"messages": [{"role": "user", "content": "hi"}]}),
        (FIXTURES / "generate_content_text.json").read_bytes(),
    )
    message = data["choices"][0]["message"]
    assert message["content"] == "The capital of South Korea is Seoul (서울)."
    assert message["reasoning_content"].startswith("**Weighing the question**")
    assert "Weighing" not in message["content"]
    assert data["choices"][0]["finish_reason"] == "stop"
    assert usage is not None and (usage.prompt, usage.completion, usage.reasoning, usage.cached) == (
        83,
        118,
        104,
        64,
    )
    assert data["usage"]["total_tokens"] == 201  # = totalTokenCount
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": 104}


def test_parse_parallel_calls_get_ids_and_json_arguments() -> None:
    data, _ = ADAPTER.parse_response(
        make_call({"messages": [{"role": "user", "content": "hi"}]}),
        (FIXTURES / "generate_content_parallel_calls.json").read_bytes(),
    )
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Seoul"},
        {"city": "Busan"},
        {"timezone": "Asia/Seoul"},
    ]
    assert len({c["id"] for c in calls}) == 3 and all(c["id"].startswith("call_") for c in calls)
    assert calls[0]["extra_content"] == {
        "google": {"thought_signature": "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rzJahzwuKGmMbdMdfpmNpgBwpl"}
    }
    assert "extra_content" not in calls[1]


def test_parse_blocked_prompt_and_bad_bodies() -> None:
    call = make_call({"messages": [{"role": "user", "content": "hi"}]})
    data, usage = ADAPTER.parse_response(call, (FIXTURES / "prompt_blocked.json").read_bytes())
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ""},
            "finish_reason": "content_filter",
        }
    ]
    assert usage is not None and usage.prompt == 12 and usage.completion == 0
    for body in (
        b"<html>502 Bad Gateway</html>",
        b'{"error": {"code": 500, "message": "boom"}}',
        b'{"candidates": []}',
    ):
        with pytest.raises(UpstreamError):
            ADAPTER.parse_response(call, body)


def test_stream_korean_split_inside_a_character_and_between_cr_lf() -> None:
    raw = (FIXTURES / "stream_korean.sse").read_bytes()
    cut = raw.index("서울".encode()) + 1  # inside the 3-byte UTF-8 sequence of 서
    crlf = raw.index(b"\r\n\r\n", cut) + 1  # between a CR and its LF
    translator = GeminiStream("google")
    chunks = feed_all(translator, [raw[:cut], raw[cut:crlf], raw[crlf:]])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "안녕하세요! 서울의 오늘 날씨는 맑고 기온은 21도입니다. <맑음>"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes == [None, None, "stop"] and translator.finished
    assert translator.usage is not None and (translator.usage.prompt, translator.usage.completion) == (9, 17)


def test_stream_parallel_calls_indexed_with_ids_and_thoughts() -> None:
    translator = GeminiStream("google")
    chunks = feed_all(translator, [(FIXTURES / "stream_parallel_calls.sse").read_bytes()])
    assert chunks[0]["choices"][0]["delta"] == {
        "reasoning_content": "**Checking two tools**\n\nThe user wants weather and time."
    }
    last = chunks[1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and "content" not in last["delta"]
    calls = last["delta"]["tool_calls"]
    assert [c["index"] for c in calls] == [0, 1]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "서울"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"timezone": "Asia/Seoul", "format": 24}
    assert calls[0]["id"] != calls[1]["id"] and all(
        c["id"].startswith("call_") and c["type"] == "function" for c in calls
    )
    assert translator.finished and translator.usage is not None
    assert (translator.usage.completion, translator.usage.reasoning) == (83, 61)


def test_stream_tool_indices_continue_across_events_and_candidates() -> None:
    translator = GeminiStream("google", candidates=2)

    def event(index: int, name: str, finish: str | None = None) -> Event:
        cand: dict[str, Any] = {
            "content": {
                "parts": [{"functionCall": {"name": name, "args": {}, "id": name + "-id"}}],
                "role": "model",
            },
            "index": index,
        }
        if finish:
            cand["finishReason"] = finish
        return Event(None, json.dumps({"candidates": [cand]}).encode())

    first = translator.feed(event(0, "a"))[0]["choices"][0]["delta"]["tool_calls"]
    second = translator.feed(event(0, "b", "STOP"))[0]["choices"][0]
    assert first[0]["index"] == 0 and first[0]["id"] == "a-id"
    assert second["delta"]["tool_calls"][0]["index"] == 1 and second["finish_reason"] == "tool_calls"
    assert not translator.finished  # candidate 1 is still open
    other = translator.feed(event(1, "c", "MAX_TOKENS"))[0]["choices"][0]
    assert (
        other["index"] == 1
        and other["delta"]["tool_calls"][0]["index"] == 0
        and other["finish_reason"] == "length"
    )
    assert translator.finished


def test_stream_errors_in_band() -> None:
    with pytest.raises(UpstreamStreamError, match="overloaded"):
        GeminiStream("google").feed(
            Event(
                None,
                b'{"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}',
            )
        )
    with pytest.raises(UpstreamStreamError, match="malformed"):
        GeminiStream("google").feed(Event(None, b'{"candidates": [{"content": {"parts": [{"te'))
    blocked = GeminiStream("google")
    assert blocked.feed(Event(None, b'{"promptFeedback": {"blockReason": "SAFETY"}}')) == [
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}
    ]
    assert blocked.finished


@pytest.mark.parametrize(
    ("reason", "calls", "expected"),
    [
        ("STOP", False, "stop"),
        ("STOP", True, "tool_calls"),
        ("MAX_TOKENS", True, "length"),
        ("SAFETY", False, "content_filter"),
        ("RECITATION", False, "content_filter"),
        ("BLOCKLIST", False, "content_filter"),
        ("SPII", False, "content_filter"),
        ("PROHIBITED_CONTENT", False, "content_filter"),
        ("IMAGE_SAFETY", False, "content_filter"),
        ("OTHER", False, "stop"),
        ("MALFORMED_FUNCTION_CALL", False, "stop"),
        ("FINISH_REASON_UNSPECIFIED", False, "stop"),
    ],
)
def test_finish_reasons(reason: str, calls: bool, expected: str) -> None:
    assert finish_reason(reason, calls) == expected


def test_usage_mapping() -> None:
    usage = usage_from_gemini(
        {
            "promptTokenCount": 100,
            "toolUsePromptTokenCount": 20,
            "candidatesTokenCount": 30,
            "thoughtsTokenCount": 50,
            "cachedContentTokenCount": 60,
            "totalTokenCount": 200,
        }
    )
    assert usage is not None and usage.openai() == {
        "prompt_tokens": 120,
        "completion_tokens": 80,
        "total_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 50},
    }
    assert usage_from_gemini(None) is None


def test_error_mapping() -> None:
    limited = ADAPTER.error(429, (FIXTURES / "error_429.json").read_bytes(), {})
    assert isinstance(limited, RateLimited) and limited.headers == {"Retry-After": "37"}
    assert (
        "rate limiting" in limited.message and "quota" not in limited.message
    )  # (the account's, not passed on)
    bad_key = ADAPTER.error(400, (FIXTURES / "error_api_key.json").read_bytes(), {})
    assert bad_key.status == 502 and bad_key.code == "upstream_auth_failed"
    rejected = ADAPTER.error(
        400, b'{"error": {"code": 400, "message": "Invalid JSON payload", "status": "INVALID_ARGUMENT"}}', {}
    )
    assert isinstance(rejected, InvalidRequest) and rejected.code == "INVALID_ARGUMENT"
    assert isinstance(
        ADAPTER.error(503, b'{"error": {"code": 503, "status": "UNAVAILABLE"}}', {}), UpstreamUnavailable
    )
    assert ADAPTER.error(500, b'{"error": {"code": 500, "status": "INTERNAL"}}', {}).status == 502


# ------------------------------------------------------------------ the emulator, through google-genai


@pytest.fixture
def gemini(stack: Stack) -> Iterator[genai.Client]:
    running = stack.emulators["google"]
    options = types.HttpOptions(base_url=running.base_url.removesuffix("/v1beta"), api_version="v1beta")
    with genai.Client(api_key=running.api_key, http_options=options) as client:
        yield client


def test_sdk_generate_content(gemini: genai.Client, stack: Stack) -> None:
    out = gemini.models.generate_content(
        model="gemini-2.5-flash",
        contents="Hello there [tokens:6]",
        config=types.GenerateContentConfig(
            system_instruction="Be brief.", temperature=0.3, max_output_tokens=100
        ),
    )
    assert out.text is not None and len(out.text.split()) == 6
    assert out.candidates is not None and out.candidates[0].finish_reason == types.FinishReason.STOP
    assert out.usage_metadata is not None and out.usage_metadata.candidates_token_count == 6
    assert out.usage_metadata.total_token_count == out.usage_metadata.prompt_token_count + 6
    assert out.model_version == "gemini-2.5-flash" and out.response_id
    body = stack.emulator("google").requests[-1]
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["generationConfig"] == {"temperature": 0.3, "maxOutputTokens": 100}


def test_sdk_stream_korean_split(gemini: genai.Client) -> None:
    chunks = list(
        gemini.models.generate_content_stream(model="gemini-2.5-flash", contents=f"[echo][split]{KOREAN}")
    )
    assert "".join(c.text or "" for c in chunks) == KOREAN
    assert len(chunks) > 3
    assert [c.candidates[0].finish_reason for c in chunks if c.candidates][-1] == types.FinishReason.STOP
    totals = [c.usage_metadata.candidates_token_count for c in chunks if c.usage_metadata]
    assert totals == sorted(totals) and totals[-1] == len(chunks)  # running totals, one token per event here


def test_sdk_function_call_and_response(gemini: genai.Client) -> None:
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(
                name="get_weather",
                description="Current weather",
                parameters=types.Schema(
                    type=types.Type.OBJECT,
                    properties={"city": types.Schema(type=types.Type.STRING)},
                    required=["city"],
                ),
            )
        ]
    )
    config = types.GenerateContentConfig(
        tools=[tool], automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)
    )
    out = gemini.models.generate_content(
        model="gemini-2.5-flash", contents="Weather in Seoul? [tool]", config=config
    )
    assert out.function_calls is not None and len(out.function_calls) == 1
    call = out.function_calls[0]
    assert call.name == "get_weather" and call.args == {"city": "Seoul"}
    history = [
        types.Content(role="user", parts=[types.Part(text="Weather in Seoul? [tool]")]),
        out.candidates[0].content,  # type: ignore[index]
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="get_weather", response={"result": "sunny"})],
        ),
    ]
    follow = gemini.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
    assert follow.text == "The tool returned: sunny"


def test_sdk_stream_parallel_calls_and_thinking(gemini: genai.Client) -> None:
    declarations = [
        types.FunctionDeclaration(
            name=t["function"]["name"], parameters_json_schema=t["function"]["parameters"]
        )
        for t in (WEATHER, TIME)
    ]
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=declarations)],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    chunks = list(
        gemini.models.generate_content_stream(
            model="gemini-2.5-flash", contents="both [tool2]", config=config
        )
    )
    parts = [p for c in chunks for p in c.candidates[0].content.parts or ()]  # type: ignore[index,union-attr]
    thoughts = [p.text for p in parts if p.thought]
    calls = [p.function_call for p in parts if p.function_call]
    assert "".join(t or "" for t in thoughts) == "Let me think."
    assert [c.name for c in calls] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    assert calls[1].args == {"timezone": "Seoul", "hour24": True}  # type: ignore[union-attr]
    assert parts[-2].thought_signature and not parts[-1].thought_signature
    assert chunks[-1].usage_metadata is not None and chunks[-1].usage_metadata.thoughts_token_count == 4


def test_sdk_thinking_non_stream(gemini: genai.Client) -> None:
    out = gemini.models.generate_content(model="gemini-2.5-pro", contents="Explain [think] [tokens:3]")
    parts = out.candidates[0].content.parts  # type: ignore[index, union-attr]
    assert parts is not None and parts[0].thought and parts[0].text == "Let me think."
    assert parts[1].text is not None and len(parts[1].text.split()) == 3 and not parts[1].thought
    assert out.usage_metadata is not None and out.usage_metadata.thoughts_token_count == 4
    assert out.usage_metadata.total_token_count == out.usage_metadata.prompt_token_count + 3 + 4


def test_sdk_errors(gemini: genai.Client, stack: Stack) -> None:
    with pytest.raises(genai_errors.ClientError) as limited:
        gemini.models.generate_content(model="gemini-2.5-flash", contents="hi [fault:429]")
    assert limited.value.code == 429 and limited.value.status == "RESOURCE_EXHAUSTED"
    assert any("RetryInfo" in d.get("@type", "") for d in limited.value.details["error"]["details"])
    with pytest.raises(genai_errors.ServerError) as unavailable:
        gemini.models.generate_content(model="gemini-2.5-flash", contents="hi [fault:503]")
    assert unavailable.value.code == 503 and unavailable.value.status == "UNAVAILABLE"
    with pytest.raises(genai_errors.APIError) as midfail:
        list(gemini.models.generate_content_stream(model="gemini-2.5-flash", contents="hi [midfail]"))
    assert midfail.value.code == 500
    with pytest.raises(genai_errors.ClientError) as missing:
        gemini.models.generate_content(model="gemini-9-nope", contents="hi")
    assert missing.value.code == 404
    running = stack.emulators["google"]
    options = types.HttpOptions(base_url=running.base_url.removesuffix("/v1beta"), api_version="v1beta")
    with (
        genai.Client(api_key="wrong", http_options=options) as wrong,
        pytest.raises(genai_errors.ClientError) as bad,
    ):
        wrong.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert bad.value.code == 400 and bad.value.message == "API key not valid. Please pass a valid API key."


def test_sdk_models_and_count_tokens(gemini: genai.Client) -> None:
    names = [m.name for m in gemini.models.list(config={"page_size": 4})]
    assert "models/gemini-2.5-flash" in names and len(names) == len(set(names)) > 4
    model = gemini.models.get(model="gemini-2.5-pro")
    assert model.output_token_limit == 65536 and model.display_name == "Gemini 2.5 Pro"
    assert gemini.models.count_tokens(model="gemini-2.5-flash", contents="hello big world").total_tokens == 3


def test_emulator_validates_like_the_real_api(gemini: genai.Client) -> None:
    with pytest.raises(genai_errors.ClientError, match="valid role"):
        gemini.models.generate_content(
            model="gemini-2.5-flash", contents=[{"role": "assistant", "parts": [{"text": "x"}]}]
        )
    with pytest.raises(genai_errors.ClientError, match="empty text"):
        gemini.models.generate_content(
            model="gemini-2.5-flash", contents=[{"role": "user", "parts": [{"text": ""}]}]
        )
    # gemini-3 models want the thought signature of their function call back on the next turn
    with pytest.raises(genai_errors.ClientError, match="thought_signature"):
        gemini.models.generate_content(
            model="gemini-3-pro-preview",
            contents=[
                {"role": "user", "parts": [{"text": "weather?"}]},
                {
                    "role": "model",
                    "parts": [{"function_call": {"name": "get_weather", "args": {"city": "Seoul"}}}],
                },
                {
                    "role": "user",
                    "parts": [
                        {"function_response": {"name": "get_weather", "response": {"result": "sunny"}}}
                    ],
                },
            ],
        )


def test_emulator_raw_wire(stack: Stack) -> None:
    """Without the SDK: ``?key=`` auth, CRLF-framed SSE, the JSON-array stream, unknown fields."""
    running = stack.emulators["google"]
    url = urlsplit(running.base_url)

    def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
        try:
            conn.request("POST", url.path + path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    hello = {"contents": [{"parts": [{"text": "hi [tokens:3]"}]}]}
    key = running.api_key
    status, sse = post(f"/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key={key}", hello)
    assert (
        status == 200 and sse.startswith(b"data: {") and sse.endswith(b"}\r\n\r\n") and b"[DONE]" not in sse
    )
    assert sse.count(b"\r\n\r\n") == 3
    status, array = post(f"/models/gemini-2.5-flash:streamGenerateContent?key={key}", hello)
    chunks = json.loads(array)
    assert status == 200 and len(chunks) == 3 and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    status, body = post(f"/models/gemini-2.5-flash:generateContent?key={key}", {**hello, "max_tokens": 5})
    assert status == 400 and json.loads(body)["error"]["status"] == "INVALID_ARGUMENT"
    assert b'Unknown name \\"max_tokens\\"' in body
    status, body = post("/models/gemini-2.5-flash:generateContent", hello)
    assert status == 403 and json.loads(body)["error"]["status"] == "PERMISSION_DENIED"


# ------------------------------------------------------------------ through the gateway with the OpenAI SDK


@pytest.mark.parametrize(
    "model", ["google/gemini-2.5-flash", "gemini/gemini-2.5-pro", "google/gemini-flash-latest"]
)
def test_gateway_plain_chat(client: openai.OpenAI, stack: Stack, model: str) -> None:
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello [tokens:7]"}]
    )
    assert out.model == model and out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    message = out.choices[0].message
    assert message.role == "assistant" and message.content and len(message.content.split()) == 7
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == 7 and out.usage.prompt_tokens > 0
    assert stack.emulator("google").requests[-1]["contents"] == [
        {"role": "user", "parts": [{"text": "Hello [tokens:7]"}]}
    ]


def test_gateway_system_prompt_and_multi_turn(client: openai.OpenAI, stack: Stack) -> None:
    out = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again [echo]"},
        ],
        temperature=0.2,
        stop=["zzz"],
    )
    assert out.choices[0].message.content == "Again"
    body = stack.emulator("google").requests[-1]
    assert body["systemInstruction"] == {"parts": [{"text": "You are terse."}]}
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"] == [{"text": "Hello."}]
    assert body["generationConfig"] == {"temperature": 0.2, "stopSequences": ["zzz"]}


def test_gateway_max_tokens_gives_length(client: openai.OpenAI, stack: Stack) -> None:
    out = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        messages=[{"role": "user", "content": "long [tokens:50]"}],
        max_tokens=4,
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert stack.emulator("google").requests[-1]["generationConfig"] == {"maxOutputTokens": 4}
    chunks = list(
        client.chat.completions.create(
            model="google/gemini-2.5-flash",
            stream=True,
            max_completion_tokens=3,
            messages=[{"role": "user", "content": "long [tokens:50]"}],
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


def test_gateway_tool_round_trip(client: openai.OpenAI, stack: Stack) -> None:
    first: Any = [{"role": "user", "content": "weather? [tool]"}]
    out = client.chat.completions.create(model="google/gemini-2.5-flash", messages=first, tools=[WEATHER])
    assert out.choices[0].finish_reason == "tool_calls"
    call = out.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Seoul"}
    assert call.id.startswith("call_")
    follow = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        tools=[WEATHER],
        messages=[
            *first,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
    )
    assert follow.choices[0].message.content == "The tool returned: sunny"
    contents = stack.emulator("google").requests[-1]["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Seoul"}}}],
    }
    assert contents[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "get_weather", "response": {"result": "sunny"}}}],
    }


def test_gateway_tool_calls_stream_parallel(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="gemini/gemini-2.5-flash",
            tools=[WEATHER, TIME],
            stream=True,
            messages=[{"role": "user", "content": "both [tool2]"}],
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [d.index for d in deltas] == [0, 1]
    assert [d.function.name for d in deltas] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    arguments = deltas[1].function.arguments  # type: ignore[union-attr]
    assert json.loads(arguments or "") == {"timezone": "Seoul", "hour24": True}
    assert len({d.id for d in deltas}) == 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]
    forced = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        messages=[{"role": "user", "content": "what time"}],
    )
    assert forced.choices[0].message.tool_calls[0].function.name == "get_time"  # type: ignore[index]


def test_gateway_thought_signature_round_trip_on_gemini_3(client: openai.OpenAI) -> None:
    first: Any = [{"role": "user", "content": "weather? [tool]"}]
    model = "google/gemini-3-pro-preview"
    out = client.chat.completions.create(model=model, messages=first, tools=[WEATHER])
    call = out.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.model_extra and call.model_extra["extra_content"]["google"]["thought_signature"]
    tool_turn = [{"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    follow = client.chat.completions.create(
        model=model,
        tools=[WEATHER],
        messages=[
            *first,
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            *tool_turn,
        ],
    )
    assert follow.choices[0].message.content == "The tool returned: sunny"
    stripped = {"id": call.id, "type": "function", "function": call.function.model_dump()}
    with pytest.raises(openai.BadRequestError, match="thought_signature"):
        client.chat.completions.create(
            model=model,
            tools=[WEATHER],
            messages=[
                *first,
                {"role": "assistant", "tool_calls": [stripped]},
                *tool_turn,
            ],
        )


def test_gateway_image_arrives_inline(client: openai.OpenAI, stack: Stack) -> None:
    out = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": PNG}},
                ],
            }
        ],
    )
    parts = stack.emulator("google").requests[-1]["contents"][0]["parts"]
    assert parts[1] == {"inlineData": {"mimeType": "image/png", "data": PNG.split(",", 1)[1]}}
    assert out.usage is not None and out.usage.prompt_tokens >= 258  # an image counts 258 tokens


def test_gateway_json_mode_and_several_candidates(client: openai.OpenAI, stack: Stack) -> None:
    out = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_object"},
        seed=5,
        n=2,
    )
    config = stack.emulator("google").requests[-1]["generationConfig"]
    assert config == {"responseMimeType": "application/json", "seed": 5, "candidateCount": 2}
    assert [c.index for c in out.choices] == [0, 1] and out.choices[0].message.content != out.choices[
        1
    ].message.content
    chunks = list(
        client.chat.completions.create(
            model="google/gemini-2.5-flash",
            messages=[{"role": "user", "content": "hi [tokens:4]"}],
            n=2,
            stream=True,
        )
    )
    finishes = sorted(
        (c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices[0].finish_reason
    )
    assert finishes == [(0, "stop"), (1, "stop")]
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == index)
        assert len(text.split()) == 4


def test_gateway_korean_streamed_intact_across_split_bytes(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="google/gemini-2.5-flash",
            messages=[{"role": "user", "content": f"[echo][split]{KOREAN}"}],
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == KOREAN


def test_gateway_reasoning_is_exposed_separately(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="google/gemini-2.5-pro", messages=[{"role": "user", "content": "hi [think] [tokens:3]"}]
    )
    message = out.choices[0].message
    assert message.reasoning_content == "Let me think."  # type: ignore[attr-defined]
    assert (
        message.content is not None and "think" not in message.content and len(message.content.split()) == 3
    )
    assert out.usage is not None and out.usage.completion_tokens == 7
    assert (
        out.usage.completion_tokens_details is not None
        and out.usage.completion_tokens_details.reasoning_tokens == 4
    )
    chunks = list(
        client.chat.completions.create(
            model="gemini/gemini-2.5-pro",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "hi [think] [tokens:3]"}],
        )
    )
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Let me think." and "think" not in content and len(content.split()) == 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ("429", openai.RateLimitError, 429),
        ("503", openai.InternalServerError, 503),
        ("500", openai.APIStatusError, 502),
    ],
)
def test_gateway_upstream_faults(
    client: openai.OpenAI, fault: str, error: type[openai.APIStatusError], status: int
) -> None:
    with pytest.raises(error) as caught:
        client.chat.completions.create(
            model="google/gemini-2.5-flash", messages=[{"role": "user", "content": f"hi [fault:{fault}]"}]
        )
    assert caught.value.status_code == status
    if status == 429:
        assert caught.value.response.headers["retry-after"] == "1"  # from google.rpc.RetryInfo


@pytest.mark.parametrize("directive", ["[midfail]", "[cut:2]", "[malformed]"])
def test_gateway_stream_failure_mid_way(client: openai.OpenAI, directive: str) -> None:
    stream = client.chat.completions.create(
        model="google/gemini-2.5-flash",
        stream=True,
        messages=[{"role": "user", "content": f"hi {directive} [tokens:8]"}],
    )
    seen: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            seen += [chunk.choices[0].delta.content or ""] if chunk.choices else []
    assert "".join(seen)  # some text arrived before the failure


def test_gateway_malformed_non_stream_is_502(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="google/gemini-2.5-flash", messages=[{"role": "user", "content": "hi [malformed]"}]
        )
    assert caught.value.status_code == 502


def test_sdk_sees_a_generated_image(gemini: genai.Client) -> None:
    """The image model answers with its text and an ``inlineData`` image, billed as output tokens."""
    out = gemini.models.generate_content(
        model="gemini-2.5-flash-image-preview", contents="draw a dot [tokens:4]"
    )
    parts = out.candidates[0].content.parts  # type: ignore[index, union-attr]
    images = [p.inline_data for p in parts if p.inline_data]  # type: ignore[union-attr]
    assert len(images) == 1 and images[0].mime_type == "image/png" and images[0].data.startswith(b"\x89PNG")  # type: ignore[union-attr]
    assert out.usage_metadata.candidates_token_count == 4 + 1290  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_gateway_returns_generated_images(client: openai.OpenAI, stack: Stack, stream: bool) -> None:
    """A Gemini image model's images reach the caller as ``message.images`` (``delta.images`` when
    streamed): data URLs, the shape OpenRouter and LiteLLM use; they were dropped while their tokens
    were billed."""
    model = "google/gemini-2.5-flash-image-preview"
    messages = [{"role": "user", "content": "draw a dot [tokens:4]"}]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )
        )
        images = [
            i for c in chunks if c.choices for i in (c.choices[0].delta.model_extra or {}).get("images", [])
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
    else:
        out = client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
        images = (out.choices[0].message.model_extra or {}).get("images", [])
        text, usage = out.choices[0].message.content or "", out.usage
    assert text and len(images) == 1 and images[0]["type"] == "image_url"
    header, data = images[0]["image_url"]["url"].split(",", 1)
    assert header == "data:image/png;base64" and base64.b64decode(data).startswith(b"\x89PNG")
    assert usage is not None and usage.completion_tokens == 4 + 1290
