"""Deployments in the settings: the single-account form as one deployment, several accounts per
provider with their credentials from the environment or a file, and start-time errors that name the
deployment (and never show a key)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from core.config import ConfigError, parse_settings
from gateway.state import Gateway

AZURE = {
    "name": "azure-eu",
    "kind": "azure",
    "base_url": "https://res.openai.azure.com/",
    "api_version": "2024-10-21",
    "api_key_env": "TEST_AZURE_KEY",
    "models": ["gpt-4o-mini", "openai/gpt-4o"],
    "model_names": {"gpt-4o-mini": "mini-eu"},
    "rpm": 600,
}


def deployments(tmp_path, *items: dict[str, Any], **provider: Any) -> dict[str, Any]:
    return {
        "store": {"url": f"sqlite:///{tmp_path}/r.db"},
        "providers": {"openai": {"deployments": list(items), **provider}},
    }


def test_the_single_account_form_is_one_deployment_named_after_the_provider(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "sk-env")
    settings = parse_settings(
        {"providers": {"openai": {"base_url": "http://o.local/v1/", "api_key": "sk-file"}}}
    )
    gw = Gateway(settings)
    (openai,) = gw.deployments["openai"]
    assert (openai.name, openai.key, openai.kind, openai.base_url, openai.api_key) == (
        "openai",
        "openai",
        "",
        "http://o.local/v1",
        "sk-file",
    )
    assert gw.deployments["mistral"][0].api_key == "sk-env"
    assert not gw.dispatcher.pools["openai"].shared  # nothing to share: no Redis round trip, no choice


def test_deployments_with_keys_from_the_environment_a_file_and_inline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TEST_AZURE_KEY", "az-secret")
    key_file = tmp_path / "key"
    key_file.write_text("  sk-from-file\n")
    raw = deployments(
        tmp_path,
        {"name": "primary", "api_key_file": str(key_file), "weight": 3, "tpm": 1000},
        {"name": "second", "api_key": "sk-inline", "base_url": "http://two.local/v1"},
        AZURE,
        routing="usage",
        model_routing={"gpt-4o": "latency"},
        sticky=True,
    )
    gw = Gateway(parse_settings(raw))
    primary, second, azure = gw.deployments["openai"]
    assert (primary.api_key, primary.weight, primary.tpm, primary.base_url) == (
        "sk-from-file",
        3.0,
        1000,
        "https://api.openai.com/v1",
    )
    assert (second.api_key, second.base_url, second.key) == (
        "sk-inline",
        "http://two.local/v1",
        "openai/second",
    )
    assert (azure.kind, azure.api_key, azure.base_url, azure.rpm) == (
        "azure",
        "az-secret",
        "https://res.openai.azure.com",
        600,
    )
    mini, big, other = (
        gw.catalog.resolve(m) for m in ("openai/gpt-4o-mini", "openai/gpt-4o", "openai/gpt-4.1")
    )
    assert azure.serves(mini) and azure.serves(big) and not azure.serves(other) and primary.serves(other)
    assert azure.upstream_name(mini) == "mini-eu" and azure.upstream_name(big) == big.upstream
    pool = gw.dispatcher.pools["openai"]
    assert pool.serving(other) == (primary, second)
    assert pool.strategy_for(big) == "latency" and pool.strategy_for(mini) == "usage" and pool.sticky
    for dep in (primary, second, azure):  # a key never shows in a repr (logs, tracebacks)
        assert dep.api_key not in repr(dep) and dep.api_key not in str([dep])


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ({"name": "east"}, "deployments 'east': no credentials"),
        ({"name": "east", "api_key": ""}, "deployments 'east': no credentials"),
        ({"name": "east", "api_key": "k", "api_key_env": "X"}, "deployments 'east': give one of"),
        (
            {"name": "east", "api_key": "k", "kind": "azur"},
            "deployments 'east': unknown kind 'azur' (known for openai: openai, azure)",
        ),
        (
            {"name": "east", "api_key": "k", "kind": "azure", "api_version": "2024-10-21"},
            "deployments 'east': kind 'azure' needs base_url",
        ),
        (
            {"name": "east", "api_key": "k", "kind": "azure", "base_url": "https://x"},
            "deployments 'east': kind 'azure' needs api_version",
        ),
        ({"name": "east", "api_key": "k", "models": ["gpt-9"]}, "deployments 'east': unknown model 'gpt-9'"),
        (
            {"name": "east", "api_key": "k", "model_names": {"anthropic/claude-haiku-4-5": "x"}},
            "belongs to the group 'anthropic'",
        ),
        ({"name": "east", "api_key": "k", "weight": 0}, "weight"),
        ({"name": "east", "api_key": "k", "rpm": -1}, "rpm"),
        ({"name": "no spaces", "api_key": "k"}, "name"),
    ],
)
def test_a_deployment_that_cannot_work_is_named_at_start(tmp_path, item: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(deployments(tmp_path, item), "router.toml")
    assert said in str(info.value) and "router.toml" in str(info.value)


def test_group_level_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="deployments 'a': the name is used twice"):
        parse_settings(deployments(tmp_path, {"name": "a", "api_key": "k"}, {"name": "a", "api_key": "k"}))
    with pytest.raises(
        ConfigError, match="providers.openai: base_url and api_key belong to each of its deployments"
    ):
        parse_settings(deployments(tmp_path, {"name": "a", "api_key": "k"}, api_key="sk-x"))
    with pytest.raises(ConfigError, match="model_routing: unknown model 'gpt-9'"):
        parse_settings(
            deployments(tmp_path, {"name": "a", "api_key": "k"}, model_routing={"gpt-9": "latency"})
        )
    with pytest.raises(ConfigError, match="routing"):
        parse_settings(deployments(tmp_path, {"name": "a", "api_key": "k"}, routing="fastest"))
    with pytest.raises(ConfigError, match=r"unknown kind 'azure' \(known for anthropic: anthropic\)"):
        parse_settings(
            {"providers": {"anthropic": {"deployments": [{"name": "a", "api_key": "k", "kind": "azure"}]}}}
        )


def test_credentials_that_cannot_be_had_are_named_at_start_without_the_key(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TEST_MISSING_KEY", raising=False)
    settings = parse_settings(deployments(tmp_path, {"name": "east", "api_key_env": "TEST_MISSING_KEY"}))
    with pytest.raises(ConfigError, match="deployments 'east': the environment variable TEST_MISSING_KEY"):
        Gateway(settings)
    missing = tmp_path / "nope"
    settings = parse_settings(deployments(tmp_path, {"name": "west", "api_key_file": str(missing)}))
    with pytest.raises(ConfigError, match=f"deployments 'west': cannot read its api_key_file {missing}"):
        Gateway(settings)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    settings = parse_settings(deployments(tmp_path, {"name": "west", "api_key_file": str(empty)}))
    with pytest.raises(ConfigError, match="deployments 'west': its api_key_file .* is empty"):
        Gateway(settings)


def test_router_serve_names_the_deployment_and_exits(tmp_path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        f'[store]\nurl = "sqlite:///{tmp_path}/r.db"\n[[providers.openai.deployments]]\nname = "east"\n'
        'api_key_env = "TEST_UNSET_VARIABLE"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "deployments 'east': the environment variable TEST_UNSET_VARIABLE" in result.stderr
