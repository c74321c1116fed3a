"""The client matrix, LangChain side: ``langchain_openai.ChatOpenAI`` (from PyPI, a dev dependency)
pointed at the gateway with only ``base_url`` and ``api_key`` changed, for every provider group."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from tests.conftest import Stack
from tests.matrix import (
    GROUPS,
    MODELS,
    PNG,
    WEATHER_PROMPT,
    Weather,
    check_chat,
    check_image,
    check_image_refused,
    check_structured,
    check_tools,
    weather,
)

pytestmark = pytest.mark.parametrize("group", GROUPS)

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return stack.key(1_000)


def chat_model(stack: Stack, key: str, group: str, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODELS[group], base_url=stack.base_url, api_key=key, max_retries=0, **kw)  # type: ignore[arg-type]


def usage(message: AIMessage) -> dict[str, Any] | None:
    u = message.usage_metadata
    return (
        None
        if u is None
        else {"input": u["input_tokens"], "output": u["output_tokens"], "total": u["total_tokens"]}
    )


def test_chat(stack: Stack, key: str, group: str) -> None:
    out = chat_model(stack, key, group).invoke("Hello")
    meta = out.response_metadata
    check_chat(
        {
            "text": out.content,
            "finish": meta["finish_reason"],
            "usage": usage(out),
            "model": meta["model_name"],
        },
        MODELS[group],
    )


def test_stream_with_usage(stack: Stack, key: str, group: str) -> None:
    chunks = list(chat_model(stack, key, group, stream_usage=True).stream("Tell me a story"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert isinstance(whole, AIMessage)
    check_chat(
        {
            "text": whole.content,
            "finish": whole.response_metadata["finish_reason"],
            "usage": usage(whole),
            "model": whole.response_metadata["model_name"],
        },
        MODELS[group],
    )


def test_tool_loop(stack: Stack, key: str, group: str) -> None:
    llm = chat_model(stack, key, group).bind_tools([TOOL])
    messages: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    first = llm.invoke(messages)
    messages.append(first)
    for call in first.tool_calls:
        messages.append(
            ToolMessage(
                json.dumps(weather(call["args"]["city"]), separators=(",", ":")), tool_call_id=call["id"]
            )
        )
    second = llm.invoke(messages)
    check_tools(
        {
            "steps": 2,
            "first_finish": first.response_metadata["finish_reason"],
            "calls": [{"name": c["name"], "input": c["args"]} for c in first.tool_calls],
            "text": second.content,
            "finish": second.response_metadata["finish_reason"],
        }
    )


def test_image_input(stack: Stack, key: str, group: str) -> None:
    import openai

    message = HumanMessage(
        content=[
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": PNG}},
        ]
    )
    llm = chat_model(stack, key, group)
    if stack.gateway.catalog.resolve(MODELS[group]).image_input:
        out = llm.invoke([message])
        check_image({"text": out.content, "usage": usage(out)})
    else:
        with pytest.raises(openai.BadRequestError) as caught:
            llm.invoke([message])
        check_image_refused({"ok": False}, caught.value.status_code, caught.value.body)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(stack: Stack, key: str, group: str, method: str) -> None:
    llm = chat_model(stack, key, group).with_structured_output(Weather, method=method)  # type: ignore[arg-type]
    out = llm.invoke("The weather in Seoul" + (" [tool]" if method == "function_calling" else ""))
    check_structured({"object": out.model_dump() if isinstance(out, Weather) else out})


def test_json_mode(stack: Stack, key: str, group: str) -> None:
    """JSON mode asks for some JSON object (its shape is the prompt's business): a real, non-empty one."""
    out = (
        chat_model(stack, key, group)
        .with_structured_output(None, method="json_mode")
        .invoke("Answer in JSON.")
    )  # type: ignore[arg-type]
    assert isinstance(out, dict) and out
