"""A gateway process killed mid-request leaves a consistent ledger after restart (SQLite store)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from tests.conftest import Stack, free_port, http_post


def _cli(config: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _config_with_key(
    tmp_path: Path, store_url: str, emulator: Any, group: str, credits: int, extra: str = ""
) -> tuple[Path, str]:
    """A router.toml in ``tmp_path`` (the store at ``store_url``, the OpenAI emulator, then ``extra``)
    and, made with the CLI, a group holding ``credits`` and a key of it: (the config's path, the key)."""
    config = tmp_path / "router.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n'
        f'[providers.openai]\nbase_url = "{emulator.base_url}"\napi_key = "{emulator.api_key}"\n{extra}'
    )
    _cli(config, "groups", "create", group, "--credits", str(credits))
    return config, _cli(config, "keys", "create", "--group", group).strip().splitlines()[-1]


def _serve(config: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("gateway did not start")


def test_second_gateway_on_one_sqlite_file_is_refused(stack: Stack, tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/one.db"\n')
    first = _serve(config, free_port())
    try:
        second = subprocess.run(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (
            second.returncode != 0
            and f"another gateway process (pid {first.pid}) already serves" in second.stderr
        )
        assert "reserved" in _cli(config, "groups", "list")  # the CLI still works beside the gateway
    finally:
        first.terminate()
        first.wait(10)


def test_killed_mid_stream_then_restart_reconciles(stack: Stack, tmp_path: Path) -> None:
    config, key = _config_with_key(
        tmp_path, f"sqlite:///{tmp_path}/crash.db", stack.emulators["openai"], "crashy", 10
    )
    port = free_port()
    proc = _serve(config, port)
    try:
        body = (
            b'{"model":"openai/gpt-4o-mini","stream":true,"max_tokens":500,'
            b'"messages":[{"role":"user","content":"slow [tokens:100] [delay:100]"}]}'
        )
        request = http_post(key, body)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            received = b""
            while received.count(b"data: ") < 3:
                received += sock.recv(65536)
            os.kill(proc.pid, signal.SIGKILL)  # mid-stream, reservation held
            proc.wait(10)
        shown = _cli(config, "groups", "show", "crashy")
        # SQLite: the call's hold lived in the killed process only; the store holds what was charged
        assert "reserved  0 credits" in shown and "balance   10 credits" in shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    port2 = free_port()
    proc = _serve(config, port2)  # restart
    try:
        shown = _cli(config, "groups", "show", "crashy")
        assert "reserved  0 credits" in shown
        assert "balance   10 credits" in shown and "spent     0 credits" in shown
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port2}/v1", api_key=key, max_retries=0)
        try:  # the restarted gateway serves and bills as before
            client.chat.completions.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            client.close()
        shown = _cli(config, "groups", "show", "crashy")
        assert "reserved  0 credits" in shown and "spent     0 credits" not in shown
    finally:
        proc.terminate()
        proc.wait(10)


def test_several_workers_on_sqlite_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/w.db"\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "--config",
            str(config),
            "serve",
            "--workers",
            "2",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "several workers need a store they can share" in out.stderr and "PostgreSQL" in out.stderr
