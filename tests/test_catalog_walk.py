"""Every catalog entry is callable: each model (snapshots and aliases too) is called once through
the gateway with the openai SDK on the first endpoint it lists, and answers."""

from __future__ import annotations

from typing import Any

import openai

from tests.conftest import Stack

ORDER = ("chat", "responses", "embeddings", "images")


def call(client: openai.OpenAI, model: str, endpoint: str) -> Any:
    if endpoint == "chat":
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=16
        )
        return answer.choices[0].message.content or answer.choices[0].message.tool_calls
    if endpoint == "responses":
        return client.responses.create(model=model, input="hi", max_output_tokens=16).output
    if endpoint == "embeddings":
        return client.embeddings.create(model=model, input="hi").data[0].embedding
    answer = client.images.generate(
        model=model, prompt="a dot", n=1, **({"quality": "low"} if model.startswith("openai/") else {})
    )
    return answer.data and answer.data[0].b64_json


def test_every_catalog_model_is_callable(stack: Stack) -> None:
    client = stack.client(stack.key(credits=1000))
    catalog = stack.gateway.catalog
    listed = {m.id: m.model_dump()["endpoints"] for m in client.models.list().data}
    assert set(listed) == set(catalog.models)
    called, failed = [], []
    for model_id, model in sorted(catalog.models.items()):
        assert model.endpoints, f"{model_id} serves no endpoint"
        assert listed[model_id] == sorted(model.endpoints)
        endpoint = next(e for e in ORDER if e in model.endpoints)
        try:
            assert call(client, model_id, endpoint), (model_id, endpoint)
        except openai.APIError as exc:
            failed.append((model_id, endpoint, str(exc)))
        called.append(endpoint)
    assert failed == []
    assert len(called) == len(catalog.models) and set(called) == set(ORDER)
