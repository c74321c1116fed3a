"""Settings: TOML decoded into structs, errors that name the bad key, environment overrides."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.config import ConfigError, Settings, load_settings, parse_settings


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTER_CONFIG", raising=False)
    settings = load_settings()
    assert settings.store.url == "sqlite:///./data/router.db"
    assert settings.server.key_prefix == "sk-mr"


def test_file_and_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.toml"
    path.write_text(
        '[server]\nport = 9000\n[providers.mistral]\nbase_url = "http://m.local/v1"\napi_key = "file-key"\n'
    )
    monkeypatch.setenv("ROUTER_CONFIG", str(path))
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("ROUTER_UPSTAGE_BASE_URL", "http://u.local/v1/")
    settings = load_settings()
    catalog = settings.load_catalog()
    assert settings.server.port == 9000
    assert settings.provider("mistral", catalog).api_key == "file-key"
    assert settings.provider("mistral", catalog).base_url == "http://m.local/v1"
    assert settings.provider("openai", catalog).api_key == "env-key"
    assert settings.provider("upstage", catalog).base_url == "http://u.local/v1"
    assert settings.provider("google", catalog).base_url.startswith("https://generativelanguage")


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"server": {"prot": 1}}, "prot"),
        ({"server": {"port": "eighty"}}, "$.server.port"),
        ({"stor": {}}, "stor"),
        ({"providers": {"openai": {"base_ulr": "x"}}}, "base_ulr"),
        ({"providers": {"acme": {"base_url": "x"}}}, "providers.acme"),
    ],
)
def test_errors_name_the_bad_key(raw: dict, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(raw, "router.toml")
    assert named in str(info.value) and "router.toml" in str(info.value)


def test_unreadable_and_invalid_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)


def test_cli_reports_config_errors(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nprot = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "config error" in result.stderr and "prot" in result.stderr


def test_settings_struct_is_default_constructible() -> None:
    assert Settings().server.max_body_bytes > 0
