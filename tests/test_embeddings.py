"""``POST /v1/embeddings``: every embedding model of the catalog through the gateway with the openai
SDK, the emulators proven with the providers' SDKs, billing and usage records, bad input and faults."""

from __future__ import annotations

import base64
import json
import math
import socket
from array import array

import openai
import pytest
from google import genai
from google.genai import types as gtypes

from billing.pricing import PER
from tests.conftest import Stack, raw_request

EMBEDDING_MODELS = {  # model -> its default vector size
    "openai/text-embedding-3-small": 1536,
    "openai/text-embedding-3-large": 3072,
    "openai/text-embedding-ada-002": 1536,
    "google/gemini-embedding-001": 3072,
    "mistral/mistral-embed": 1024,
    "mistral/codestral-embed": 1536,
    "upstage/embedding-query": 4096,
    "upstage/embedding-passage": 4096,
    "upstage/solar-embedding-1-large-query": 4096,
}


def _unit(vector: list[float]) -> bool:
    return abs(math.sqrt(sum(x * x for x in vector)) - 1) < 1e-3


@pytest.mark.parametrize("model", sorted(EMBEDDING_MODELS))
def test_every_embedding_model_through_the_gateway(stack: Stack, model: str) -> None:
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    texts = ["the router embeds", "a second sentence to embed", "the router embeds"]
    answer = client.embeddings.create(model=model, input=texts)  # the SDK asks base64, decodes it
    assert answer.model == model and answer.object == "list"
    assert [d.index for d in answer.data] == [0, 1, 2]
    vectors = [d.embedding for d in answer.data]
    assert {len(v) for v in vectors} == {EMBEDDING_MODELS[model]}
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]  # deterministic, and per input
    assert all(_unit(v) for v in vectors)
    floats = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    assert answer.usage.prompt_tokens > 0 and answer.usage.total_tokens == answer.usage.prompt_tokens
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert len(records) == 2 and {r.endpoint for r in records} == {"embeddings"}
    assert {r.status for r in records} == {"ok"} and {r.completion_tokens for r in records} == {0}
    price = stack.gateway.catalog.resolve(model).prices.input
    for record in records:
        assert record.prompt_tokens > 0 and record.credits == -(-record.prompt_tokens * price // PER)
    assert records[-1].prompt_tokens == answer.usage.prompt_tokens  # the first call (newest first)
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == sum(r.credits for r in records) > 0 and g.reserved == 0


def test_dimensions_token_arrays_and_extra_fields(stack: Stack) -> None:
    client = stack.client()
    small = client.embeddings.create(model="openai/text-embedding-3-small", input="shorter", dimensions=256)
    assert len(small.data[0].embedding) == 256
    tokens = client.embeddings.create(model="openai/text-embedding-3-large", input=[[1, 2, 3], [4, 5]])
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5
    one = client.embeddings.create(model="openai/text-embedding-3-large", input=[1, 2, 3])
    assert one.data[0].embedding == tokens.data[0].embedding
    code = client.embeddings.create(model="mistral/codestral-embed", input="def f(): pass", dimensions=3072)
    assert len(code.data[0].embedding) == 3072
    assert stack.emulator("mistral").requests[-1]["output_dimension"] == 3072
    gemini = client.embeddings.create(
        model="google/gemini-embedding-001",
        input=["a query"],
        dimensions=768,
        extra_body={"task_type": "RETRIEVAL_QUERY"},
    )
    assert len(gemini.data[0].embedding) == 768
    sent = stack.emulator("google").requests[-1]
    assert sent["taskType"] == "RETRIEVAL_QUERY" and sent["outputDimensionality"] == 768
    doc = client.embeddings.create(
        model="google/gemini-embedding-001",
        input=["a query"],
        dimensions=768,
        extra_body={"task_type": "RETRIEVAL_DOCUMENT"},
    )
    assert doc.data[0].embedding != gemini.data[0].embedding  # the task reached the model


def test_gemini_usage_reported_or_estimated(stack: Stack) -> None:
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    client.embeddings.create(model="google/gemini-embedding-001", input="one text alone")  # :embedContent
    client.embeddings.create(
        model="google/gemini-embedding-001", input=["two", "texts"]
    )  # :batchEmbedContents
    batch, single = stack.run(stack.store.usage(group=group, limit=10))
    assert (single.usage_exact, batch.usage_exact) == (False, True)  # counted here / reported by Gemini
    assert single.prompt_tokens == 3 and batch.prompt_tokens == 2 and single.credits > 0


def _error(stack: Stack, body: object, key: str | None = None) -> tuple[int, dict]:
    reply = raw_request(
        stack,
        "POST",
        "/v1/embeddings",
        json.dumps(body).encode(),
        {"authorization": f"Bearer {key or stack.key()}", "content-type": "application/json"},
    )
    return reply.status, reply.json()["error"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"model": "openai/text-embedding-3-small", "input": ""}, "input", "empty"),
        ({"model": "openai/text-embedding-3-small", "input": []}, "input", "empty"),
        ({"model": "openai/text-embedding-3-small", "input": ["a", ""]}, "input[1]", "empty"),
        ({"model": "openai/text-embedding-3-small", "input": [["a"]]}, "input[0]", "token"),
        ({"model": "openai/text-embedding-3-small", "input": ["a", 1]}, "input", "mix"),
        ({"model": "openai/text-embedding-3-small", "input": {"a": 1}}, "input", "string"),
        ({"model": "openai/text-embedding-3-small"}, "input", "input"),
        ({"input": "x"}, "model", "model"),
        ({"model": "upstage/embedding-query", "input": ["x"] * 101}, "input", "at most 100"),
        ({"model": "google/gemini-embedding-001", "input": ["x"] * 101}, "input", "at most 100"),
        ({"model": "mistral/mistral-embed", "input": [[1, 2]]}, "input", "text only"),
        ({"model": "google/gemini-embedding-001", "input": [1, 2]}, "input", "text only"),
        (
            {"model": "openai/text-embedding-ada-002", "input": "x", "dimensions": 512},
            "dimensions",
            "does not support",
        ),
        (
            {"model": "openai/text-embedding-3-small", "input": "x", "dimensions": 2000},
            "dimensions",
            "between 1 and 1536",
        ),
        (
            {"model": "google/gemini-embedding-001", "input": "x", "dimensions": 64},
            "dimensions",
            "between 128",
        ),
        ({"model": "openai/text-embedding-3-small", "input": "x", "dimensions": 0}, "dimensions", "positive"),
        (
            {"model": "openai/text-embedding-3-small", "input": "x", "encoding_format": "int8"},
            "encoding_format",
            "base64",
        ),
        ({"model": "openai/text-embedding-3-small", "input": "x", "stream": True}, "stream", "stream"),
        ({"model": "openai/gpt-4o-mini", "input": "x"}, "model", "does not serve"),
        ({"model": "anthropic/claude-haiku-4-5", "input": "x"}, "model", "Anthropic has no embedding models"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(stack: Stack, body: dict, param: str, says: str) -> None:
    group = stack.group(5)
    status, error = _error(stack, body, stack.key(group=group))
    assert status == 400 and error["param"] == param and says in error["message"], error
    assert error["type"] == "invalid_request_error"
    (record,) = stack.run(stack.store.usage(group=group, limit=10))
    assert (record.status, record.endpoint, record.credits) == ("rejected", "embeddings", 0)


def test_body_over_the_limit_is_a_413(stack: Stack) -> None:
    limit = stack.settings.server.max_body_bytes
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.key()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {limit + 10}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"model": "openai/text-embedding-3-small", "input": "' + b"x" * 1000)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_too_large" and str(limit) in error["message"]


def test_unknown_model_is_a_404(stack: Stack) -> None:
    status, error = _error(stack, {"model": "openai/text-embedding-9", "input": "x"})
    assert status == 404 and error["code"] == "model_not_found"


def test_upstream_failure_is_settled_once_and_costs_nothing(stack: Stack) -> None:
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    with pytest.raises(openai.InternalServerError) as info:
        client.embeddings.create(model="openai/text-embedding-3-small", input="boom [fault:503]")
    assert info.value.status_code == 503
    with pytest.raises(openai.APIStatusError) as bad:
        client.embeddings.create(model="mistral/mistral-embed", input="garbled [malformed]")
    assert bad.value.status_code == 502
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert [r.status for r in records] == ["error", "error"] and {r.credits for r in records} == {0}
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == 0 and g.reserved == 0


def test_fallback_to_another_embedding_model(stack: Stack) -> None:
    """OpenAI out of credit (its 429 insufficient_quota; the other groups ignore [fault:402]): the
    request's own ``models`` list moves the call to Mistral, billed at Mistral's price."""
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    answer = client.embeddings.create(
        model="openai/text-embedding-3-small",
        input="quota [fault:402]",
        extra_body={"models": ["mistral/mistral-embed"]},
    )
    assert len(answer.data[0].embedding) == 1024
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert sorted((r.model, r.status) for r in records) == [
        ("mistral/mistral-embed", "ok"),
        ("openai/text-embedding-3-small", "error"),
    ]


def test_too_few_credits_is_a_402_before_the_upstream(stack: Stack) -> None:
    group = stack.group(0.000001)
    client = stack.client(stack.key(group=group))
    before = len(stack.emulator("openai").requests)
    with pytest.raises(openai.APIStatusError) as info:
        client.embeddings.create(model="openai/text-embedding-3-large", input=["many words here"] * 200)
    assert info.value.status_code == 402
    assert len(stack.emulator("openai").requests) == before


def test_models_lists_the_embedding_endpoint(stack: Stack) -> None:
    client = stack.client()
    cards = {m.id: m for m in client.models.list().data}
    for model in EMBEDDING_MODELS:
        card = cards[model].model_dump()
        assert card["endpoints"] == ["embeddings"] and card["kind"] == "embedding"
    assert "embeddings" not in cards["openai/gpt-4o-mini"].model_dump()["endpoints"]


# -- the emulators, with the providers' own SDKs ----------------------------------------------------
@pytest.mark.parametrize("prefix", ["openai", "mistral", "upstage"])
def test_openai_sdk_against_the_emulators(stack: Stack, prefix: str) -> None:
    running = stack.emulators[prefix]
    model = {"openai": "text-embedding-3-small", "mistral": "mistral-embed", "upstage": "embedding-passage"}[
        prefix
    ]
    with openai.OpenAI(base_url=running.base_url, api_key=running.api_key, max_retries=0) as sdk:
        first = sdk.embeddings.create(model=model, input=["same text", "other"])
        again = sdk.embeddings.create(model=model, input="same text", encoding_format="float")
        assert first.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-6)
        assert first.usage.prompt_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=running.base_url, api_key="wrong", max_retries=0).embeddings.create(
                model=model, input="x"
            )
        with pytest.raises(openai.InternalServerError):
            sdk.embeddings.create(model=model, input="x [fault:500]")


def test_openai_emulator_base64_is_little_endian_float32(stack: Stack) -> None:
    running = stack.emulators["openai"]
    with openai.OpenAI(base_url=running.base_url, api_key=running.api_key, max_retries=0) as sdk:
        raw = sdk.embeddings.with_raw_response.create(
            model="text-embedding-3-small", input="x", encoding_format="base64"
        )
        packed = json.loads(raw.http_response.text)["data"][0]["embedding"]
        floats = sdk.embeddings.create(model="text-embedding-3-small", input="x", encoding_format="float")
    assert list(array("f", base64.b64decode(packed))) == pytest.approx(floats.data[0].embedding, abs=1e-6)


def test_google_genai_sdk_against_the_emulator(stack: Stack) -> None:
    running = stack.emulators["google"]
    options = gtypes.HttpOptions(base_url=running.base_url.removesuffix("/v1beta"), api_version="v1beta")
    client = genai.Client(api_key=running.api_key, http_options=options)
    answer = client.models.embed_content(
        model="gemini-embedding-001",
        contents=["first text", "second text"],
        config=gtypes.EmbedContentConfig(output_dimensionality=256, task_type="RETRIEVAL_DOCUMENT"),
    )
    assert answer.embeddings is not None and [len(e.values or []) for e in answer.embeddings] == [256, 256]
    again = client.models.embed_content(
        model="gemini-embedding-001",
        contents="first text",
        config=gtypes.EmbedContentConfig(output_dimensionality=256, task_type="RETRIEVAL_DOCUMENT"),
    )
    assert again.embeddings is not None and again.embeddings[0].values == answer.embeddings[0].values
    wrong = genai.Client(api_key="wrong", http_options=options)
    with pytest.raises(genai.errors.ClientError):
        wrong.models.embed_content(model="gemini-embedding-001", contents="x")
    with pytest.raises(genai.errors.ClientError) as info:
        client.models.embed_content(model="gemini-embedding-001", contents=["x"] * 101)
    assert "at most 100" in str(info.value)
    client.close()
    wrong.close()
