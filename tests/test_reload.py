"""Configuration reload without a restart: applied to the calls that start after it, while calls in
flight finish on what they started with; a configuration that does not load changes nothing. In process
(Gateway.reload), and end to end: ``router serve`` reloading on SIGHUP and through the admin API
(audited), its file read again."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from billing.pricing import cost
from cli.demo import with_emulators
from core.catalog import BUILTIN, ConfigError
from core.config import parse_settings
from core.wire import TokenUsage
from emulators.openai import OpenAIEmulator
from emulators.registry import read_banner
from tests.conftest import Stack, free_port
from tests.test_demo import free_ports

ADMIN = "admin-token-for-the-reload-tests-0123456789"
MINI = "openai/gpt-4o-mini-2024-07-18"


def priced(path: Path, factor: int) -> Path:
    """A catalog file that sets gpt-4o-mini's prices to ``factor`` times the built-in ones."""
    text = BUILTIN.read_text()
    block = re.search(r'\[\[models\]\]\nid = "openai/gpt-4o-mini-2024-07-18"\n.*?(?=\n\n)', text, re.S)
    assert block
    price = f'price = {{ input = "{0.15 * factor:g}", cached_input = "{0.075 * factor:g}", output = "{0.6 * factor:g}" }}'
    path.write_text(re.sub(r"price = \{[^}]*\}", price, block.group(0)) + "\n")
    return path


def test_a_reload_applies_to_new_calls_and_calls_in_flight_keep_theirs(tmp_path: Path) -> None:
    stack = Stack(tmp_path, extra={"new": OpenAIEmulator("openai", "key-new")}).start()
    try:
        gw = stack.gateway
        group = stack.group(100)
        client = stack.client(stack.key(group=group))
        old_prices = gw.catalog.resolve(MINI).prices
        # a stream in flight: started on the old prices
        chunks: list[Any] = []
        stream = client.chat.completions.create(
            model="openai/gpt-4o-mini",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "[tokens:40] [delay:40]"}],
        )
        reader = threading.Thread(target=lambda: chunks.extend(stream), daemon=True)
        reader.start()
        time.sleep(0.3)  # (the stream is under way: 40 tokens at 40 ms)
        raw = {
            "catalog": {"path": str(priced(tmp_path / "catalog.toml", 10))},
            "providers": {
                "openai": {
                    "deployments": [
                        {
                            "name": "primary",
                            "base_url": stack.emulators["openai"].base_url,
                            "api_key": stack.emulators["openai"].api_key,
                        },
                        {
                            "name": "new",
                            "base_url": stack.extra_urls["new"] + "/v1",
                            "api_key": "key-new",
                            "weight": 1000,
                        },
                    ]
                }
            },
        }
        settings = with_emulators(parse_settings(raw), stack.emulators)
        settings = type(settings)(
            **{
                **{f: getattr(settings, f) for f in settings.__struct_fields__},
                "store": gw.settings.store,
                "reliability": gw.settings.reliability,
            }
        )
        assert stack.run(_reload(gw, settings)) == []
        reader.join(10)
        assert chunks and chunks[-1].usage is not None
        records = stack.run(stack.store.usage(group=group))
        (streamed,) = records
        usage = TokenUsage(prompt=streamed.prompt_tokens, completion=streamed.completion_tokens)
        assert streamed.credits == cost(old_prices, usage)  # billed at its start's prices
        # new calls: the new prices, and the new deployment takes them
        answer = client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        after = stack.run(stack.store.usage(group=group))[0]
        usage = TokenUsage(prompt=after.prompt_tokens, completion=after.completion_tokens)
        assert (
            after.credits == cost(gw.catalog.resolve(MINI).prices, usage)
            and gw.catalog.resolve(MINI).prices.input == 10 * old_prices.input
        )
        assert (
            after.deployment == "new" and stack.extra["new"].served >= 1 and answer.choices[0].message.content
        )
        # a configuration that does not load changes nothing
        router, catalog = gw.dispatcher, gw.catalog
        broken = parse_settings(
            {
                "providers": {
                    "openai": {
                        "deployments": [{"name": "gone", "api_key_env": "ROUTER_TEST_NO_SUCH_VARIABLE"}]
                    }
                }
            }
        )
        with pytest.raises(ConfigError, match="ROUTER_TEST_NO_SUCH_VARIABLE"):
            stack.run(_reload(gw, broken))
        assert gw.dispatcher is router and gw.catalog is catalog
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        assert stack.run(stack.store.usage(group=group))[0].deployment == "new"
    finally:
        stack.stop()


async def _reload(gw: Any, settings: Any) -> list[str]:
    return list(gw.reload(settings))


def test_router_serve_reloads_on_sighup_and_through_the_admin_api(tmp_path: Path) -> None:
    port, emulators = free_port(), free_ports(5)
    emu = subprocess.Popen(
        [sys.executable, "-m", "cli", "emulators", "--port", str(emulators)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert emu.stdout is not None
    urls = {prefix: url for prefix, (url, _) in read_banner(emu.stdout).items()}
    config = tmp_path / "router.toml"

    def write(catalog: Path | None = None, broken: bool = False) -> None:
        lines = [
            "[store]",
            f'url = "sqlite:///{tmp_path}/router.db"',
            "",
            "[console]",
            f'admin_token = "{ADMIN}"',
            "",
        ]
        if catalog is not None:
            lines += ["[catalog]", f'path = "{catalog}"', ""]
        for prefix, url in urls.items():
            lines += [f"[providers.{prefix}]", f'base_url = "{url}"', f'api_key = "emu-{prefix}-key"', ""]
        if broken:
            lines += ["[providers.nowhere]", 'base_url = "http://x"', ""]
        config.write_text("\n".join(lines))

    write()
    cli = [sys.executable, "-m", "cli", "--config", str(config)]
    subprocess.run([*cli, "groups", "create", "g", "--credits", "100"], check=True, capture_output=True)
    key = (
        subprocess.run(
            [*cli, "keys", "create", "--group", "g", "--name", "k"],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    server = subprocess.Popen(
        [*cli, "serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait(port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        assert _input_price(client) == "0.15"
        write(priced(tmp_path / "ten.toml", 10))
        server.send_signal(signal.SIGHUP)
        assert _until(lambda: _input_price(client) == "1.5")
        write(priced(tmp_path / "twenty.toml", 20), broken=True)  # an unknown provider: refused whole
        server.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert _input_price(client) == "1.5"
        answer = _admin(port, "POST", "/console/api/reload")
        assert answer[0] == 400 and "nowhere" in answer[1]["error"]["message"]
        write(priced(tmp_path / "twenty.toml", 20))
        status, body = _admin(port, "POST", "/console/api/reload")
        assert status == 200 and body["reloaded"] is True and _input_price(client) == "3"
        status, audit = _admin(port, "GET", "/console/api/audit?action=config.reload")
        assert status == 200 and audit["data"][0]["action"] == "config.reload"
        assert client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        ).choices
        client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        assert server.stderr is not None
        log = server.stderr.read().decode()
        server.stderr.close()
        emu.terminate()
        emu.wait(10)
        emu.stdout.close()
    assert "configuration reloaded" in log and "configuration not reloaded" in log and "nowhere" in log


def _input_price(client: openai.OpenAI) -> str:
    return str((client.models.retrieve("openai/gpt-4o-mini").model_extra or {})["pricing"]["input"])


def _until(check: Any, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def _wait(port: int) -> None:
    assert _until(lambda: _answers(port), 30), "router serve did not start"


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except OSError:
        return False


def _admin(port: int, method: str, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        headers={"Authorization": f"Bearer {ADMIN}"},
        data=b"{}" if method == "POST" else None,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
        exc.close()
        return exc.code, body
