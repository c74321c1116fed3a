"""The OpenAI Agents SDK (``openai-agents``) against the gateway: an agent with a function
tool, run on a Claude and a Gemini model through the SDK's Responses model with its OpenAI client
pointed at the gateway (tracing disabled: nothing is exported), then continued with
``previous_response_id`` — on the same model, and across providers — from the gateway's stored
responses."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from tests.conftest import Stack

MODELS = ["anthropic/claude-haiku-4-5", "google/gemini-2.5-flash"]


@pytest.fixture(autouse=True)
def _no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)
    yield


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return json.dumps({"city": city, "temperature_c": 21})


def _agent(client: openai.AsyncOpenAI, model: str) -> Agent:
    return Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )


@pytest.mark.parametrize("model", MODELS)
def test_agent_with_a_tool_then_previous_response_id(stack: Stack, model: str) -> None:
    key = stack.key()

    async def run() -> tuple[str, str, str | None, str | None]:
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
        try:
            agent = _agent(client, model)
            first = await Runner.run(agent, "What is the weather in Seoul? [tool]")
            second = await Runner.run(
                agent, "What did you tell me?", previous_response_id=first.last_response_id
            )
            return (
                str(first.final_output),
                str(second.final_output),
                first.last_response_id,
                second.last_response_id,
            )
        finally:
            await client.close()

    first, second, first_id, second_id = stack.run(run())
    assert '"temperature_c":21' in first.replace(" ", "")  # the tool ran and its result came back
    assert second and first_id and second_id
    sync = stack.client(key)
    assert sync.responses.retrieve(second_id).previous_response_id == first_id
    provider = model.split("/")[0]
    sent = json.dumps(stack.emulator(provider).requests[-1])
    assert "Seoul" in sent and "What did you tell me?" in sent  # the chain was expanded for the provider


def test_agent_conversation_moves_from_claude_to_gemini(stack: Stack) -> None:
    key = stack.key()

    async def run() -> tuple[str, str | None]:
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
        try:
            first = await Runner.run(_agent(client, MODELS[0]), "What is the weather in Seoul? [tool]")
            second = await Runner.run(
                _agent(client, MODELS[1]),
                "Repeat the temperature.",
                previous_response_id=first.last_response_id,
            )
            return str(second.final_output), second.last_response_id
        finally:
            await client.close()

    text, last = stack.run(run())
    assert text and last
    sent = json.dumps(stack.emulator("google").requests[-1])
    assert "temperature_c" in sent and "Repeat the temperature." in sent  # Claude's tool turn, seen by Gemini


def test_an_agent_with_a_plain_model_string_through_multi_provider(stack: Stack) -> None:
    """``Agent(model="anthropic/claude-haiku-4-5")``: the Agents SDK reads the prefix as its own provider
    (``anthropic/`` is unknown to it, ``openai/`` an alias it strips) unless its MultiProvider is told to
    send the whole string (``openai_prefix_mode="model_id"``, ``unknown_prefix_mode="model_id"``), as the
    docs/api.md shows."""
    from agents import MultiProvider, RunConfig

    key = stack.key()

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
        provider = MultiProvider(
            openai_client=client,
            openai_use_responses=True,
            openai_prefix_mode="model_id",
            unknown_prefix_mode="model_id",
        )
        try:
            out = []
            for model in ("anthropic/claude-haiku-4-5", "openai/gpt-4o-mini"):
                agent = Agent(
                    name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model
                )
                result = await Runner.run(
                    agent,
                    "What is the weather in Seoul? [tool]",
                    run_config=RunConfig(model_provider=provider),
                )
                out.append(str(result.final_output))
            return out
        finally:
            await client.close()

    for answer in stack.run(run()):
        assert '"temperature_c":21' in answer.replace(" ", "")
    assert stack.emulator("anthropic").requests[-1]["model"] == "claude-haiku-4-5-20251001"
    assert stack.emulator("openai").requests[-1]["model"] == "gpt-4o-mini-2024-07-18"
