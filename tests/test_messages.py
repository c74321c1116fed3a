"""Anthropic's Messages API (``/v1/messages``) on every group, through the official ``anthropic`` SDK:
passed through for Claude, translated for the others; its errors in Anthropic's dialect; each call
billed once, also when the caller hangs up or the upstream fails halfway; count_tokens never billed.
Claude Code itself: tests/test_claude_code.py."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import anthropic
import pytest

from core import inputs
from core.catalog import Catalog, ConfigError
from core.config import parse_settings
from core.errors import InvalidRequest
from core.kept import Shared
from core.wire import Tool
from tests.conftest import Stack, raw_request
from tests.matrix import GROUPS, MODELS, PNG

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: Any = [
    {
        "name": "get_weather",
        "description": "The weather now",
        "input_schema": WEATHER,
        "cache_control": {"type": "ephemeral"},
    }
]
HI: Any = [{"role": "user", "content": "hello"}]


def sdk(stack: Stack, key: str, **kw: Any) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{stack.port}", api_key=key, max_retries=0, **kw)
    stack.clients.append(client)  # closed after the test: its pooled sockets are not left to the GC
    return client


def billed_once(stack: Stack, group: str, calls: int) -> list[Any]:
    """The group's records: one per call, and what it spent is their sum with nothing held."""
    records = stack.run(stack.store.usage(group=group, limit=100))
    assert len(records) == calls, [(r.status, r.error_code) for r in records]
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.reserved == 0 and g.spent == sum(r.credits for r in records)
    return records


@pytest.mark.parametrize("group", GROUPS)
def test_create_stream_and_count_on_every_group(stack: Stack, group: str) -> None:
    model = MODELS[group]
    name = stack.group(10)
    client = sdk(stack, stack.key(group=name))
    answer = client.messages.create(
        model=model, max_tokens=100, system="Be brief.", messages=HI, metadata={"user_id": "alice"}
    )
    assert answer.type == "message" and answer.role == "assistant" and answer.model == model
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text" and answer.content[0].text
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
    with client.messages.stream(model=model, max_tokens=100, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0 and final.model == model
    count = client.messages.count_tokens(model=model, messages=HI, tools=TOOLS)
    assert count.input_tokens > 3
    records = billed_once(stack, name, 2)  # the count is not a call
    assert {r.endpoint for r in records} == {"messages"} and {r.status for r in records} == {"ok"}
    assert all(r.credits > 0 and r.model == stack.gateway.catalog.resolve(model).id for r in records)
    assert [r.end_user for r in records].count("alice") == 1
    assert sorted(r.stream for r in records) == [False, True]


@pytest.mark.parametrize("group", GROUPS)
def test_a_two_step_tool_loop_streamed_with_thinking(stack: Stack, group: str) -> None:
    model = MODELS[group]
    client = sdk(stack, stack.key())
    messages: Any = [{"role": "user", "content": "What is the weather in Seoul? [tool] [think]"}]
    with client.messages.stream(
        model=model,
        max_tokens=4000,
        tools=TOOLS,
        messages=messages,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        events = [event.type for event in stream]
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    kinds = [block.type for block in first.content]
    assert kinds[-1] == "tool_use" and ("thinking" in kinds) == (kinds[0] == "thinking")
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and isinstance(call.input, dict)
    assert set(call.input) == {"city"}  # the arguments streamed as input_json_delta, put together
    if group == "anthropic":  # Anthropic's own thinking block, signature and all, relayed as it came
        assert first.content[0].type == "thinking" and first.content[0].signature
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": "21 C, sunny"}],
                }
            ],
        },
    ]
    second = client.messages.create(
        model=model,
        max_tokens=4000,
        tools=TOOLS,
        messages=messages,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert second.stop_reason == "end_turn"
    assert "21 C, sunny" in "".join(b.text for b in second.content if b.type == "text")


@pytest.mark.parametrize("group", GROUPS)
def test_an_image_and_a_tool_error(stack: Stack, group: str) -> None:
    model = MODELS[group]
    client = sdk(stack, stack.key())
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG.split(",", 1)[1]},
    }
    content: Any = [image, {"type": "text", "text": "What is in it?"}]
    if not stack.gateway.catalog.resolve(model).image_input:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(
                model=model, max_tokens=50, messages=[{"role": "user", "content": content}]
            )
        assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "does not accept image input" in info.value.message
        return
    answer = client.messages.create(
        model=model, max_tokens=50, messages=[{"role": "user", "content": content}]
    )
    assert answer.content[0].type == "text" and answer.usage.input_tokens > 0
    failed: Any = [
        {"role": "user", "content": "Weather? [tool]"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Seoul"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "station offline"}],
                }
            ],
        },
    ]
    answer = client.messages.create(model=model, max_tokens=50, tools=TOOLS, messages=failed)
    said = "".join(b.text for b in answer.content if b.type == "text")
    assert "station offline" in said and ("Error" in said) == (
        group != "anthropic"
    )  # (Anthropic: is_error as sent)
    if (
        group == "openai"
    ):  # an image a tool returned: after the tool's text, in a user turn (chat tool messages are text)
        failed[-1]["content"][0]["content"].append(image)
        client.messages.create(model=model, max_tokens=50, tools=TOOLS, messages=failed)
        sent = stack.emulator("openai").requests[-1]["messages"]
        assert sent[-2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: station offline"}
        assert sent[-1]["role"] == "user" and sent[-1]["content"][0]["image_url"]["url"] == PNG


def test_the_sdks_typed_errors(stack: Stack) -> None:
    client = sdk(stack, stack.key())
    with pytest.raises(anthropic.AuthenticationError) as auth:
        sdk(stack, "sk-nope").messages.create(model=MODELS["openai"], max_tokens=5, messages=HI)
    assert auth.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": auth.value.body["error"]["message"]},
    }  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="anthropic/claude-none", max_tokens=5, messages=HI)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODELS["google"], max_tokens=5, messages=[{"role": "tool", "content": "x"}]
        )  # type: ignore[typeddict-item]
    assert (
        bad.value.body["error"]["type"] == "invalid_request_error" and "messages.0.role" in bad.value.message
    )  # type: ignore[index]
    # malformed bodies, raw: each a 400 in Anthropic's shape naming the field
    headers = {
        "x-api-key": stack.key(),
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    for body, field in (
        (b"{", "JSON"),
        (b'{"model": "gpt-4o", "messages": []}', "messages"),
        (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
        (
            b'{"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "mcp_servers": []}',
            "mcp_servers",
        ),
        (
            b'{"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "bogus": 1}',
            "bogus",
        ),
        (
            b'{"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]}',
            "messages.0.content",
        ),
    ):
        r = raw_request(stack, "POST", "/v1/messages", body, headers)
        assert r.status == 400 and r.json()["type"] == "error", (body, r.text)
        assert (
            r.json()["error"]["type"] == "invalid_request_error" and field in r.json()["error"]["message"]
        ), r.text
    # a path or method the API lacks: Anthropic's shape too
    assert (
        raw_request(stack, "GET", "/v1/messages", None, headers).json()["error"]["type"]
        == "invalid_request_error"
    )


def test_the_key_in_either_header_and_out_of_credit(stack: Stack) -> None:
    group = stack.group(0.001)
    key = stack.key(group=group)
    bearer = anthropic.Anthropic(base_url=f"http://127.0.0.1:{stack.port}", auth_token=key, max_retries=0)
    stack.clients.append(bearer)
    assert bearer.messages.create(model="gpt-4o-mini", max_tokens=5, messages=HI).model == "gpt-4o-mini"
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk(stack, key).messages.create(model=MODELS["anthropic"], max_tokens=20_000, messages=HI)
    assert info.value.status_code == 402 and info.value.body["error"]["type"] == "billing_error"  # type: ignore[index]
    assert "credit" in info.value.message


def test_anthropic_headers_and_body_pass_through(stack: Stack) -> None:
    """Everything Claude Code sends reaches Anthropic as sent, only the model renamed; the answer comes
    back as sent with the caller's model id."""
    emulator = stack.emulator("anthropic")
    client = sdk(stack, stack.key())
    body: Any = {
        "model": "claude-opus-4-8",
        "max_tokens": 3000,
        "messages": HI,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "u-1"},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    }
    betas = ["context-management-2025-06-27", "effort-2025-11-24"]
    answer = client.beta.messages.create(**body, tools=TOOLS, betas=betas)  # (POST /v1/messages?beta=true)
    assert answer.model == "claude-opus-4-8" and answer.content[0].type == "thinking"
    assert emulator.requests[-1] == {**body, "tools": TOOLS, "model": "claude-opus-4-8"}
    assert emulator.headers[-1]["anthropic-beta"] == ",".join(betas)
    # a refusal of the caller's request keeps Anthropic's words (Claude Code recovers by them)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="claude-opus-4-8",
            max_tokens=3000,
            messages=HI,
            extra_body={"temperature": 0.5},
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert (
        info.value.body["error"]["message"] == "`temperature` may only be set to 1 when thinking is enabled"
    )  # type: ignore[index]


def test_hosted_tools_are_left_out_elsewhere_and_named(stack: Stack) -> None:
    key = stack.key()
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    body = {"model": MODELS["google"], "max_tokens": 50, "messages": HI, "tools": [search, *TOOLS]}
    headers = {"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"}
    r = raw_request(stack, "POST", "/v1/messages", json.dumps(body).encode(), headers)
    assert r.status == 200 and r.headers["x-router-omitted-tools"] == "web_search"
    forced = {**body, "tool_choice": {"type": "tool", "name": "web_search"}}
    r = raw_request(stack, "POST", "/v1/messages", json.dumps(forced).encode(), headers)
    assert r.status == 400 and "web_search" in r.json()["error"]["message"]
    on_claude = {**body, "model": MODELS["anthropic"]}  # Anthropic runs it itself: sent as it is
    r = raw_request(stack, "POST", "/v1/messages", json.dumps(on_claude).encode(), headers)
    assert r.status == 200 and "x-router-omitted-tools" not in r.headers
    assert stack.emulator("anthropic").requests[-1]["tools"][0] == search


@pytest.mark.parametrize("group", GROUPS)
def test_the_same_tools_every_turn_are_made_once(stack: Stack, group: str) -> None:
    """Claude Code sends the same tools every turn. Decoded once (core.inputs.decode_object), they are a
    kept set (core.kept.Shared), and what is made of them is kept on it: on Claude their JSON, passed
    through; elsewhere the chat tools, their structs and what the adapter sends. The provider gets them
    the same on the next turn and, translated, as a chat call with the same tools sends them (whose own
    set is kept the same way)."""
    name = f"look_up_{group}"  # (a set of this test's own)
    tools: Any = [{"name": name, "description": "Looks a word up", "input_schema": WEATHER}, *TOOLS]
    client, emulator = sdk(stack, stack.key()), stack.emulator(group)
    sent = []
    for _ in range(2):
        client.messages.create(model=MODELS[group], max_tokens=50, messages=HI, tools=tools)
        sent.append(emulator.requests[-1]["tools"])
    as_chat = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in tools
    ]
    body = {"model": MODELS[group], "messages": HI, "max_tokens": 50, "tools": as_chat}
    r = raw_request(
        stack,
        "POST",
        "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {stack.key()}", "Content-Type": "application/json"},
    )
    assert r.status == 200 and sent[0] == sent[1] == (
        tools if group == "anthropic" else emulator.requests[-1]["tools"]
    )
    adapter = {"anthropic": "anthropic", "google": "gemini"}.get(
        group
    )  # (else an OpenAI-like one: the set's JSON)

    def kept(first: Any) -> Any:
        sets = [v for v, _ in inputs._kept.values.values() if isinstance(v, list) and v and v[0] == first]
        assert len(sets) == 1 and type(sets[0]) is Shared
        return sets[0]

    chat_sets = [kept(as_chat[0])]  # the chat call's own set
    if group == "anthropic":
        assert kept(tools[0]).made["json"] is not None  # passed through, encoded once
    else:
        chat = kept(tools[0]).made["chat"]  # the Messages call's tools, as chat tools
        assert [tool["function"]["name"] for tool in chat] == [name, "get_weather"]
        chat_sets.append(chat)
    for chat_tools in chat_sets:
        assert (
            chat_tools.made[Tool].made[adapter].made.get("json") if adapter else chat_tools.made.get("json")
        ) is not None


@pytest.mark.parametrize("group", ["anthropic", "google"])
def test_a_stream_the_caller_leaves_is_billed_once_for_what_was_generated(stack: Stack, group: str) -> None:
    name = stack.group(10)
    key = stack.key(group=name)
    body = json.dumps(
        {
            "model": MODELS[group],
            "max_tokens": 500,
            "stream": True,
            "messages": [{"role": "user", "content": "[tokens:200] [delay:20]"}],
        }
    ).encode()
    request = (
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\nanthropic-version: 2023-06-01\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", stack.port)) as conn:
        conn.sendall(request)
        got = b""
        while got.count(b"text_delta") < 10:
            got += conn.recv(65536)
    for _ in range(100):
        records = stack.run(stack.store.usage(group=name, limit=10))
        if records:
            break
        time.sleep(0.05)
    (record,) = billed_once(stack, name, 1)
    assert record.status == "interrupted" and 10 <= record.completion_tokens < 200 and record.credits > 0


@pytest.mark.parametrize("group", ["anthropic", "openai"])
def test_an_upstream_failing_mid_stream_ends_with_an_error_event_billed_once(
    stack: Stack, group: str
) -> None:
    name = stack.group(10)
    client = sdk(stack, stack.key(group=name))
    with pytest.raises(anthropic.APIStatusError) as info:  # noqa: PT012
        with client.messages.stream(
            model=MODELS[group], max_tokens=100, messages=[{"role": "user", "content": "[midfail]"}]
        ) as stream:
            for _ in stream:
                pass
    assert info.value.body["type"] == "error"  # type: ignore[index]
    (record,) = billed_once(stack, name, 1)
    assert record.status == "error" and record.completion_tokens >= 1


def test_bare_and_mapped_model_names(stack: Stack, tmp_path: Any) -> None:
    catalog = Catalog.load()
    assert catalog.resolve("claude-opus-4-8").id == "anthropic/claude-opus-4-8"
    assert catalog.resolve("GPT-4o-mini").id == "openai/gpt-4o-mini"
    settings = parse_settings(
        {
            "models": {
                "map": {"claude-haiku-4-5": "google/gemini-2.5-flash"},
                "groups": {"team-a": {"claude-haiku-4-5": "mistral/mistral-small-latest"}},
            }
        }
    )
    named = settings.load_catalog()
    assert named.resolve("claude-haiku-4-5").id == "google/gemini-2.5-flash"
    assert named.resolve("claude-haiku-4-5", "team-a").id == "mistral/mistral-small-latest"
    assert named.resolve("claude-haiku-4-5", "team-b").id == "google/gemini-2.5-flash"
    with pytest.raises(ConfigError):
        parse_settings({"models": {"map": {"x": "openai/no-such-model"}}})
    extra = tmp_path / "catalog.toml"  # the same name under two providers: ambiguous when bare
    extra.write_text('[[models]]\nid = "mistral/gpt-4o-mini"\nprice = { input = "1", output = "1" }\n')
    two = Catalog.load(extra)
    with pytest.raises(InvalidRequest) as info:
        two.resolve("gpt-4o-mini")
    assert (
        info.value.code == "ambiguous_model"
        and "openai/gpt-4o-mini, mistral/gpt-4o-mini" in info.value.message
    )
    # through the gateway: the bare id echoed as sent on chat too
    answer = sdk(stack, stack.key()).messages.create(model="claude-haiku-4-5", max_tokens=5, messages=HI)
    assert answer.model == "claude-haiku-4-5"


def test_cache_writes_and_reads_are_billed_at_their_prices(stack: Stack) -> None:
    """Claude's prompt cache through /v1/messages: a one-hour write at its price (2x input), a read at
    the cached price (LiteLLM billed reads at the full input price: BerriAI/litellm#35127)."""
    name = stack.group(10)
    client = sdk(stack, stack.key(group=name))
    rules = " ".join(f"rule{i} keep it short" for i in range(400))  # over the 1024 tokens a cache needs
    system: Any = [{"type": "text", "text": rules, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    first = client.messages.create(model="claude-haiku-4-5", max_tokens=20, system=system, messages=HI)
    second = client.messages.create(model="claude-haiku-4-5", max_tokens=20, system=system, messages=HI)
    assert (
        first.usage.cache_creation is not None and first.usage.cache_creation.ephemeral_1h_input_tokens > 1024
    )
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    older, newer = reversed(billed_once(stack, name, 2))
    # haiku 4.5 per token, in nano-credits: input 1,000, a one-hour write 2,000, a read 100, output 5,000
    u = first.usage
    assert (
        older.credits == u.input_tokens * 1000 + u.cache_creation_input_tokens * 2000 + u.output_tokens * 5000
    )  # type: ignore[operator]
    u = second.usage
    assert newer.credits == u.input_tokens * 1000 + u.cache_read_input_tokens * 100 + u.output_tokens * 5000  # type: ignore[operator]
    assert older.cache_write_tokens == first.usage.cache_creation_input_tokens and newer.cached_tokens > 1024


@pytest.mark.slow  # (seconds of its own: not in make test-fast)
def test_a_slow_upstream_gets_keep_alives_then_the_stream(tmp_path: Any) -> None:
    """While the upstream is slow to answer, the stream has begun with SSE comments (Claude Code counts
    every byte and gives up on a silent stream), then Anthropic's events follow; an upstream failure after
    the keep-alives is Anthropic's error event."""
    from core.config import ReliabilitySettings, Settings, StoreSettings

    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9, stream_keepalive=0.2),
    )
    slow = Stack(tmp_path, settings).start()
    try:
        key = slow.key()
        for group in ("anthropic", "google"):
            body = json.dumps(
                {
                    "model": MODELS[group],
                    "max_tokens": 50,
                    "stream": True,
                    "messages": [{"role": "user", "content": "[slow:900] hello"}],
                }
            ).encode()
            r = raw_request(
                slow, "POST", "/v1/messages", body, {"x-api-key": key, "content-type": "application/json"}
            )
            assert (
                r.status == 200 and r.text.startswith(": keep-alive") and "event: message_stop" in r.text
            ), r.text[:300]
        failing = json.dumps(
            {
                "model": MODELS["anthropic"],
                "max_tokens": 50,
                "stream": True,
                "messages": [{"role": "user", "content": "[slow:900] [fault:500]"}],
            }
        ).encode()
        r = raw_request(
            slow, "POST", "/v1/messages", failing, {"x-api-key": key, "content-type": "application/json"}
        )
        assert (
            r.text.startswith(": keep-alive") and "event: error" in r.text and '"type":"api_error"' in r.text
        ), r.text
    finally:
        slow.stop()


def test_a_count_fails_over_from_a_dead_deployment(tmp_path: Any) -> None:
    """count_tokens on an Anthropic model goes the way of every call (gateway/counting.py): a deployment
    that does not answer is left for the next one (before, the count went to the first one listed, alone)."""
    from core.config import Settings
    from emulators.anthropic import AnthropicEmulator
    from tests.conftest import free_port, metric

    def build(urls: dict[str, str]) -> Settings:
        items = [
            {
                "name": "dead",
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "api_key": "key-dead",
                "weight": 1000,
            },
            {"name": "b", "base_url": urls["b"] + "/v1", "api_key": "key-b"},
        ]
        return parse_settings(
            {
                "store": {"url": f"sqlite:///{tmp_path}/router.db"},
                "reliability": {"max_retries": 0, "breaker_threshold": 10**9},
                "providers": {"anthropic": {"deployments": items}},
            },
            "test",
        )

    stack = Stack(tmp_path, extra={"b": AnthropicEmulator("key-b")}, configure=build).start()  # type: ignore[arg-type]
    failed = 'router_deployment_calls_total{deployment="dead",outcome="error",provider="anthropic"}'
    try:
        before = metric(stack, failed)
        claude = sdk(stack, stack.key())
        for _ in range(3):
            raw = claude.messages.with_raw_response.count_tokens(model=MODELS["anthropic"], messages=HI)
            assert raw.headers["x-router-token-count"] == "provider" and raw.parse().input_tokens > 0
        assert metric(stack, failed) > before  # the dead one was tried (it comes first by its weight)
    finally:
        stack.close_clients()
        stack.stop()


def test_the_frames_written_from_templates_are_what_their_events_would_encode_to() -> None:
    """MessageSynth writes message_start and the text deltas as bytes around their values: each is byte
    for byte the frame of the event dict it stands for (quotes, escapes and non-ASCII included)."""
    from gateway.messages_events import MessageSynth, frame

    piece = 'say "hi"\n\u00e9\u2028 \\ \U0001f600'
    synth = MessageSynth("msg_1", 'x/"m\u00e9"')
    counts = dict.fromkeys(
        ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"), 0
    )
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": 'x/"m\u00e9"',
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": counts,
    }
    assert synth.start() == frame({"type": "message_start", "message": message}) + frame({"type": "ping"})
    out: list[bytes] = []
    for text in ("a", piece):
        synth.feed({"choices": [{"index": 0, "delta": {"content": text}}]}, out)
    synth.feed({"choices": [{"index": 0, "delta": {"reasoning_content": piece}}]}, out)
    assert out == [
        frame({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        frame({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}}),
        frame({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        frame({"type": "content_block_stop", "index": 0}),
        frame(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            }
        ),
        frame(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "thinking_delta", "thinking": piece},
            }
        ),
    ]
