"""Cost in the answer: ``usage.cost`` (credits, an exact decimal) in every non-stream answer (chat and
Responses) with ``x-request-cost``, in a chat stream's usage chunk and a Responses stream's final
response, and in batch output lines — always the usage record's credits, to the nano-credit, for every
provider; the OpenAI SDK's own types still parse every answer. An interrupted stream has no usage
chunk: its record says what it cost. ``[billing] cost_in_answer = false`` leaves it all out."""

from __future__ import annotations

import asyncio
import json
import socket
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseCompletedEvent

from billing.store import UsageRecord
from core.catalog import NANO
from core.config import BillingSettings, ReliabilitySettings, Settings, StoreSettings
from tests.conftest import Stack, http_post
from tests.matrix import MODELS
from tests.test_batches import lines_of, request, submit, wait

HI = [{"role": "user", "content": "say something [tokens:12]"}]


def exact(text: str) -> Any:
    return json.loads(text, parse_float=Decimal)


def record_of(stack: Stack, group: str, request_id: str) -> UsageRecord:
    records = stack.run(stack.store.usage(group=group, limit=500))
    (found,) = [r for r in records if r.request_id == request_id]
    return found


def charged(record: UsageRecord) -> Decimal:
    assert record.credits > 0
    return Decimal(record.credits) / NANO


def post(stack: Stack, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}{path}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("group_name", list(MODELS))
def test_chat_cost_equals_the_record(stack: Stack, group_name: str) -> None:
    group = stack.group(5)
    key = stack.key(group=group)
    model = MODELS[group_name]
    answer = post(stack, key, "/chat/completions", {"model": model, "messages": HI})
    assert answer.status_code == 200, answer.text
    body = exact(answer.text)
    ChatCompletion.model_validate_json(answer.text)  # the SDK's own type, strictly
    record = record_of(stack, group, answer.headers["x-request-id"])
    assert body["usage"]["cost"] == charged(record) == Decimal(answer.headers["x-request-cost"])
    assert body["usage"]["prompt_tokens"] == record.prompt_tokens

    streamed = post(
        stack,
        key,
        "/chat/completions",
        {"model": model, "messages": HI, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = sse_data(streamed.text)
    for chunk in chunks:
        ChatCompletionChunk.model_validate_json(chunk)
    usage = exact(chunks[-1])["usage"]
    record = record_of(stack, group, streamed.headers["x-request-id"])
    assert usage["cost"] == charged(record) and "x-request-cost" not in streamed.headers

    # the SDK, as a caller uses it: the extra field is kept
    sdk = stack.client(key).chat.completions.create(model=model, messages=HI)  # type: ignore[arg-type]
    assert sdk.usage is not None and Decimal(str(sdk.usage.model_extra["cost"])) > 0  # type: ignore[index]


@pytest.mark.parametrize("group_name", list(MODELS))
def test_a_messages_stream_carries_its_cost_in_its_last_message_delta(stack: Stack, group_name: str) -> None:
    """Passed through to Anthropic or translated, a ``/v1/messages`` stream's last ``message_delta``
    carries the charge in its usage, after the usage record's credits; Anthropic's SDK reads the
    stream as its own (events in order, ``message_stop`` last)."""
    group = stack.group(5)
    key = stack.key(group=group)
    body = {"model": MODELS[group_name], "max_tokens": 64, "stream": True, "messages": HI}
    streamed = httpx.post(f"{stack.base_url}/messages", json=body, headers={"x-api-key": key}, timeout=30)
    assert streamed.status_code == 200, streamed.text
    events = [line[7:] for line in streamed.text.split("\n") if line.startswith("event: ")]
    assert events[-2:] == ["message_delta", "message_stop"] and events.count("message_delta") == 1
    delta = exact(sse_data(streamed.text)[-2])
    record = record_of(stack, group, streamed.headers["x-request-id"])
    assert delta["type"] == "message_delta" and delta["usage"]["cost"] == charged(record)
    assert delta["usage"]["output_tokens"] == record.completion_tokens
    with stack.anthropic_client(key).messages.stream(
        model=MODELS[group_name], max_tokens=64, messages=HI
    ) as sdk:
        kinds = [event.type for event in sdk]
    assert kinds[-1] == "message_stop" and "message_delta" in kinds


@pytest.mark.parametrize("group_name", list(MODELS))
def test_responses_cost_equals_the_record(stack: Stack, group_name: str) -> None:
    group = stack.group(5)
    key = stack.key(group=group)
    model = MODELS[group_name]
    answer = post(stack, key, "/responses", {"model": model, "input": "say something [tokens:12]"})
    assert answer.status_code == 200, answer.text
    Response.model_validate_json(answer.text)
    record = record_of(stack, group, answer.headers["x-request-id"])
    assert exact(answer.text)["usage"]["cost"] == charged(record) == Decimal(answer.headers["x-request-cost"])

    streamed = post(
        stack, key, "/responses", {"model": model, "input": "say something [tokens:12]", "stream": True}
    )
    terminal = sse_data(streamed.text)[-1]
    event = ResponseCompletedEvent.model_validate_json(terminal)
    assert event.type == "response.completed"
    record = record_of(stack, group, streamed.headers["x-request-id"])
    assert exact(terminal)["response"]["usage"]["cost"] == charged(record)


def test_a_failed_stream_and_an_interrupted_one(stack: Stack) -> None:
    group = stack.group(5)
    key = stack.key(group=group)
    # the upstream breaks off mid-stream: the Responses stream's failed response still carries the charge
    failed = post(
        stack,
        key,
        "/responses",
        {"model": MODELS["anthropic"], "input": "long [tokens:40] [midfail]", "stream": True},
    )
    terminal = exact(sse_data(failed.text)[-1])
    assert terminal["type"] == "response.failed"
    record = record_of(stack, group, failed.headers["x-request-id"])
    assert record.status == "error" and terminal["response"]["usage"]["cost"] == charged(record)

    # the caller goes away: no usage chunk reaches anyone, the record alone says what was charged
    body = json.dumps(
        {
            "model": MODELS["openai"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "long [tokens:200] [delay:20]"}],
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", stack.port))
    sock.sendall(http_post(key, body))
    received = b""
    while received.count(b"data: ") < 4:
        received += sock.recv(65536)
    sock.close()
    assert b'"cost"' not in received
    for _ in range(100):
        interrupted = [
            r for r in stack.run(stack.store.usage(group=group, limit=10)) if r.status == "interrupted"
        ]
        if interrupted:
            break
        stack.run(asyncio.sleep(0.05))
    (record,) = interrupted
    assert record.credits > 0 and not record.usage_exact


def test_batch_output_lines_carry_the_cost(stack: Stack) -> None:
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    items = [request(f"c{n}", MODELS[name], "hi [tokens:9]") for n, name in enumerate(MODELS)]
    batch = wait(client, submit(client, items).id)
    assert batch.status == "completed", batch
    text = client.files.content(batch.output_file_id).text
    records = {r.request_id: r for r in stack.run(stack.store.usage(group=group, limit=50))}
    lines = [json.loads(line, parse_float=Decimal) for line in text.splitlines()]
    assert len(lines) == len(items) and lines_of(client, batch.output_file_id)
    for line in lines:
        response = line["response"]
        assert response["body"]["usage"]["cost"] == charged(records[response["request_id"]])


def test_cost_off_by_config(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path,
        Settings(
            store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
            reliability=ReliabilitySettings(max_retries=0),
            billing=BillingSettings(cost_in_answer=False),
        ),
    ).start()
    try:
        key = stack.key()
        answer = post(stack, key, "/chat/completions", {"model": MODELS["openai"], "messages": HI})
        assert answer.status_code == 200 and "cost" not in answer.json()["usage"]
        assert "x-request-cost" not in answer.headers
        streamed = post(
            stack,
            key,
            "/chat/completions",
            {
                "model": MODELS["openai"],
                "messages": HI,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert "cost" not in json.loads(sse_data(streamed.text)[-1])["usage"]
    finally:
        stack.close_clients()
        stack.stop()
