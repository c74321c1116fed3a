"""GET /v1/models and the catalog behind it."""

from __future__ import annotations

import openai
import pytest

from core.catalog import Catalog, ConfigError
from tests.conftest import Stack, raw_request


def test_models_list_through_sdk(client: openai.OpenAI) -> None:
    models = list(client.models.list())
    ids = {m.id for m in models}
    prefixes = {i.split("/", 1)[0] for i in ids}
    assert prefixes == {"openai", "anthropic", "google", "upstage", "mistral"}  # canonical prefixes only
    assert all(i == i.lower() and i.count("/") == 1 for i in ids)
    assert {
        "anthropic/claude-sonnet-4-5",
        "anthropic/claude-sonnet-4-5-20250929",
        "mistral/mistral-large-latest",
        "upstage/solar-pro3",
        "google/gemini-2.5-flash",
    } <= ids
    kinds = {m.kind for m in models}  # type: ignore[attr-defined]
    assert {"chat", "reasoning", "search", "code", "image-generation", "image-preview"} <= kinds
    first = models[0]
    assert first.object == "model" and first.created > 0 and first.owned_by


def test_model_entry_carries_our_fields(stack: Stack) -> None:
    r = raw_request(stack, "GET", "/v1/models", headers={"Authorization": f"Bearer {stack.key()}"})
    assert r.status == 200
    entry = next(m for m in r.json()["data"] if m["id"] == "openai/gpt-4o-mini")
    assert entry["alias_of"] == "openai/gpt-4o-mini-2024-07-18"
    assert entry["pricing"] == {
        "input": "0.15",
        "output": "0.6",
        "cached_input": "0.075",
        "unit": "credits per 1M tokens",
    }
    assert entry["context_length"] == 128000 and entry["image_input"] is True
    assert entry["endpoints"] == ["chat", "messages", "responses"]


def test_pricing_shows_the_cache_write_price_that_is_billed(client: openai.OpenAI) -> None:
    sonnet = client.models.retrieve("anthropic/claude-sonnet-4-5").model_extra
    assert sonnet is not None and sonnet["pricing"] == {
        "input": "3",
        "output": "15",
        "cached_input": "0.3",
        "cache_write": "3.75",
        "cache_write_1h": "6",
        "unit": "credits per 1M tokens",
    }
    listed = {m.id: m.model_extra or {} for m in client.models.list()}
    assert listed["anthropic/claude-sonnet-4-5"] == sonnet
    assert "cache_write" not in listed["mistral/mistral-large-latest"]["pricing"]  # none: billed as input


def test_retrieve_resolves_prefix_alias_and_echoes_the_id_sent(client: openai.OpenAI) -> None:
    model = client.models.retrieve("claude/claude-haiku-4-5")
    assert model.id == "claude/claude-haiku-4-5"  # as every answer echoes the model sent
    assert model.model_dump(exclude={"id"}) == client.models.retrieve(
        "anthropic/claude-haiku-4-5"
    ).model_dump(exclude={"id"})
    assert client.models.retrieve("gemini/gemini-2.5-pro").id == "gemini/gemini-2.5-pro"
    assert client.models.retrieve("anthropic/claude-haiku-4-5").id == "anthropic/claude-haiku-4-5"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("openai/nope")


def test_the_list_has_every_catalog_entry_snapshots_and_aliases(stack: Stack, client: openai.OpenAI) -> None:
    """As OpenAI lists snapshots and aliases as models: each catalog entry once, under its own prefix."""
    listed = {m.id: (m.model_extra or {}) for m in client.models.list()}
    assert set(listed) == set(stack.gateway.catalog.models)
    assert listed["openai/gpt-4o-2024-08-06"]["alias_of"] is None
    assert listed["openai/gpt-4o"]["alias_of"] == "openai/gpt-4o-2024-08-06"
    assert listed["anthropic/claude-sonnet-latest"]["alias_of"] == "anthropic/claude-sonnet-4-6"


def test_models_follow_the_keys_allow_list(stack: Stack) -> None:
    allowed = ["anthropic/claude-sonnet-4-5", "openai/gpt-4o-mini"]
    client = stack.client(stack.key(models=allowed))
    assert [m.id for m in client.models.list()] == sorted(allowed)
    assert client.models.retrieve("claude/claude-sonnet-4-5").id == "claude/claude-sonnet-4-5"
    for hidden in ("openai/gpt-4o", "google/gemini-2.5-flash"):
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve(hidden)
        assert info.value.code == "model_not_found" and hidden in info.value.message  # type: ignore[attr-defined]
    assert len(list(stack.client().models.list())) > 20  # a key without a list still sees every model


def test_models_needs_a_key(stack: Stack) -> None:
    assert raw_request(stack, "GET", "/v1/models").status == 401


def test_catalog_rejects_bad_entries(tmp_path) -> None:
    bad = tmp_path / "extra.toml"
    bad.write_text('[[models]]\nid = "openai/x"\nprice = { input = "0.0000000001" }\n')
    with pytest.raises(ConfigError, match="more than 9 decimals"):
        Catalog.load(bad)
    bad.write_text('[[models]]\nid = "nowhere/x"\n')
    with pytest.raises(ConfigError, match="unknown provider 'nowhere'"):
        Catalog.load(bad)
    bad.write_text('[[models]]\nid = "openai/x"\ncolour = "red"\n')
    with pytest.raises(ConfigError, match="colour"):
        Catalog.load(bad)


def test_operator_catalog_adds_a_model(tmp_path) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text(
        '[[models]]\nid = "mistral/ministral-8b-2410"\nprice = { input = "0.1", output = "0.1" }\n'
    )
    catalog = Catalog.load(extra)
    assert catalog.resolve("mistral/ministral-8b-2410").upstream == "ministral-8b-2410"
    assert catalog.resolve("openai/gpt-4o").upstream == "gpt-4o-2024-08-06"


# Anthropic's model pages (docs/providers.md, "Model capabilities"): a 1M-token context, 128K output
@pytest.mark.parametrize("model", ["anthropic/claude-opus-4-8", "anthropic/claude-sonnet-4-6"])
def test_anthropic_output_ceiling_is_the_documented_one(
    stack: Stack, client: openai.OpenAI, model: str
) -> None:
    hello = [{"role": "user", "content": "hello"}]
    out = client.chat.completions.create(model=model, max_tokens=128_000, messages=hello)  # type: ignore[arg-type]
    assert out.choices[0].finish_reason == "stop"
    assert stack.emulator("anthropic").requests[-1]["max_tokens"] == 128_000
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=128_001, messages=hello)  # type: ignore[arg-type]
    assert info.value.param == "max_tokens" and "at most 128000 output tokens" in info.value.message  # type: ignore[attr-defined]
    card = client.models.retrieve(model).model_extra or {}
    assert card["context_length"] == 1_000_000 and card["max_output_tokens"] == 128_000


def test_gpt_5_5_context_is_the_documented_one(client: openai.OpenAI) -> None:
    card = client.models.retrieve("openai/gpt-5.5").model_extra or {}  # OpenAI's model page: 1,050,000
    assert card["context_length"] == 1_050_000 and card["max_output_tokens"] == 128_000


def test_only_models_that_chat_say_they_take_tools(stack: Stack) -> None:
    r = raw_request(stack, "GET", "/v1/models", headers={"Authorization": f"Bearer {stack.key()}"})
    cards = {m["id"]: m for m in r.json()["data"]}
    assert cards["openai/gpt-4o-mini"]["tools"] is True
    assert cards["mistral/mistral-embed"]["tools"] is False and cards["openai/gpt-image-1"]["tools"] is False
    assert all(not m["tools"] for m in cards.values() if m["kind"] in ("embedding", "image-generation"))
