"""The client matrix's cells and what each must show, shared by the Node clients' test
(tests/test_client_matrix.py: each script in tests/clients/ reports its cells as JSON) and
LangChain's (tests/test_client_langchain.py). Every client reports a cell's data in the same shape:

    chat, stream  {"text", "finish", "usage": {"input", "output", "total"}, "model"?}
    tools         {"steps", "first_finish", "calls": [{"name", "input"}], "text", "finish"}
    structured    {"object"}
    image         {"text", "usage"}   or, for a model without image input, the client's error
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pydantic

# the model each provider group is tried with (the README's examples)
MODELS = {
    "openai": "openai/gpt-4o-mini",
    "anthropic": "anthropic/claude-haiku-4-5",
    "google": "google/gemini-2.5-flash",
    "upstage": "upstage/solar-pro3",
    "mistral": "mistral/mistral-small-latest",
}
GROUPS = list(MODELS)
WEATHER_PROMPT = "What is the weather in Seoul? [tool]"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def weather(city: str) -> dict[str, Any]:
    """What the tool answers (as tests/clients/harness.mjs)."""
    return {"city": city, "temperature_c": 21, "conditions": "sunny"}


class Day(pydantic.BaseModel, extra="forbid"):
    day: str
    high_c: float


class Weather(pydantic.BaseModel, extra="forbid"):
    """The structured-output schema (as tests/clients/harness.mjs): each type, an enum, nested objects."""

    city: str
    temperature_c: float
    conditions: Literal["sunny", "cloudy", "rain"]
    forecast: list[Day]


def check_usage(usage: dict[str, Any] | None) -> None:
    assert usage is not None, "no usage"
    assert usage["input"] > 0 and usage["output"] > 0
    assert usage["total"] == usage["input"] + usage["output"]


def check_chat(data: dict[str, Any], model: str) -> None:
    assert data["text"], "no text"
    assert data["finish"] == "stop"
    check_usage(data["usage"])
    if data.get("model") is not None:
        assert data["model"] == model  # the id sent is the id answered


def check_tools(data: dict[str, Any]) -> None:
    assert data["steps"] == 2
    assert data["first_finish"] in ("tool_calls", "tool-calls")
    assert [c["name"] for c in data["calls"]] == ["get_weather"]
    assert isinstance(data["calls"][0]["input"]["city"], str)
    # the emulators answer a tool result by quoting it: the second step saw what the tool returned
    assert '"temperature_c":21' in data["text"].replace(" ", "")
    assert data["finish"] == "stop"


def check_structured(data: dict[str, Any]) -> None:
    Weather.model_validate(data["object"])


def check_image(data: dict[str, Any]) -> None:
    assert data["text"], "no text"
    check_usage(data["usage"])


def check_image_refused(cell: dict[str, Any], status: int | None, body: Any) -> None:
    """A model the catalog says takes no images: the client raised the gateway's 400."""
    assert not cell["ok"], "a model without image input answered an image"
    assert status == 400
    text = body if isinstance(body, str) else json.dumps(body)
    assert "image_input_unsupported" in text
