"""The gateway on stock hypercorn (``[server] fast_path = false``): the server layer that replaces some
of hypercorn's internals is optional, and the gateway answers the same without it. The rest of the
suite runs on the fast path (tests/conftest.py installs it, as ``router serve`` does); here a real
``router demo`` process on stock hypercorn gets the HTTP calls each endpoint's clients make. And the
fast path refuses a hypercorn it was not verified on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest

from core.catalog import ConfigError
from server.serve import check_hypercorn, hypercorn_version
from tests.conftest import free_port
from tests.test_demo import free_ports


def test_the_fast_path_refuses_a_hypercorn_it_was_not_verified_on() -> None:
    check_hypercorn(hypercorn_version())  # the locked one
    with pytest.raises(ConfigError) as info:
        check_hypercorn("0.19.0")
    assert "fast_path = false" in str(info.value) and "\n" not in str(info.value)


def test_every_endpoint_on_stock_hypercorn(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        f'[server]\nfast_path = false\n\n[store]\nurl = "sqlite:///{tmp_path}/data/router.db"\n'
    )
    port = free_port()
    with open(tmp_path / "demo.out", "w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "cli", "demo", "--port", str(port), "--emulator-port", str(free_ports(7))],
            cwd=tmp_path,
            env={**os.environ, "ROUTER_CONFIG": str(config)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        ready = _wait(port, tmp_path / "data" / "demo-key", demo)
        assert ready["server"].endswith(", stock"), ready["server"]
        key = (tmp_path / "data" / "demo-key").read_text().strip()
        base = f"http://127.0.0.1:{port}/v1"
        with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as client:
            hi = [{"role": "user", "content": "Hello"}]
            assert (
                client.chat.completions.create(model="openai/gpt-4o-mini", messages=hi)
                .choices[0]
                .message.content
            )  # type: ignore[arg-type]
            chunks = list(
                client.chat.completions.create(
                    model="google/gemini-2.5-flash",
                    messages=hi,
                    stream=True,  # type: ignore[arg-type]
                    stream_options={"include_usage": True},
                )
            )
            assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
            events = list(
                client.responses.create(model="anthropic/claude-haiku-4-5", input="Hello", stream=True)
            )
            assert events[-1].type == "response.completed"
            assert client.embeddings.create(model="openai/text-embedding-3-small", input="one").data
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(model="openai/gpt-4o-mini", messages=[])
        with anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=key, max_retries=0) as claude:
            with claude.messages.stream(model="claude-haiku-4-5", max_tokens=50, messages=hi) as stream:  # type: ignore[arg-type]
                assert "".join(stream.text_stream)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(30)


def _wait(port: int, key_file: Path, process: subprocess.Popen[bytes]) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the demo stopped"
        try:
            if key_file.exists():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                    return dict(json.loads(response.read()))
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the demo did not start")
