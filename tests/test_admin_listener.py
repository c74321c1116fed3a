"""``[console] listen``: the console and the admin API on a listener of their own (a port or a Unix
socket), apart from /v1, through real ``router serve`` processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Postgres, free_port, wait_healthy

TOKEN = "admin-token-of-the-own-listener-0123456789"


def _serve(tmp_path: Path, listen: str, *extra: str, store: str = "") -> tuple[subprocess.Popen[bytes], int]:
    config = tmp_path / "router.toml"
    config.write_text(
        f'[store]\nurl = "{store or f"sqlite:///{tmp_path}/router.db"}"\n'
        f'[console]\nadmin_token = "{TOKEN}"\nlisten = "{listen}"\n'
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_healthy(port, proc, log)
    return proc, port


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.terminate()
        assert proc.wait(30) == 0


def _apart(main: httpx.Client, console: httpx.Client) -> None:
    """The console and the admin API answer on ``console`` alone, /v1 and the probes on ``main`` alone;
    both are one gateway (a key made through the admin listener works on /v1)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert main.get("/console/login").status_code == 404
    assert main.get("/console/api/groups", headers=auth).status_code == 404
    assert main.post("/console/api/groups", headers=auth, json={"name": "nope"}).status_code == 404
    assert console.get("/console/login").status_code == 200
    assert (
        console.post("/console/api/groups", headers=auth, json={"name": "team", "credits": "5"}).status_code
        == 201
    )
    made = console.post("/console/api/groups/team/keys", headers=auth, json={"name": "ci"})
    assert made.status_code == 201, made.text
    key = made.json()["key"]
    for path in ("/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert console.get(path, headers={"Authorization": f"Bearer {key}"}).status_code == 404, path
    assert "this listener serves the console" in console.get("/v1/models").json()["error"]["message"]
    assert (
        console.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={}).status_code
        == 404
    )
    assert main.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert main.get("/healthz").status_code == 200


def test_the_console_on_a_port_of_its_own(tmp_path: Path, served: list[subprocess.Popen[bytes]]) -> None:
    own = free_port()
    proc, port = _serve(tmp_path, f"127.0.0.1:{own}")
    served.append(proc)
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as main,
        httpx.Client(base_url=f"http://127.0.0.1:{own}") as console,
    ):
        _apart(main, console)


def test_the_console_on_a_unix_socket_only_its_user_may_open(
    tmp_path: Path, served: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "console.sock"
    proc, port = _serve(tmp_path, f"unix:{path}")
    served.append(proc)
    assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as main,
        httpx.Client(base_url="http://console", transport=httpx.HTTPTransport(uds=str(path))) as console,
    ):
        _apart(main, console)


def test_workers_share_the_console_listener(
    tmp_path: Path, served: list[subprocess.Popen[bytes]], pg: Postgres
) -> None:
    """``--workers 2``: the parent binds the console's socket once, as it does the main one."""
    path = tmp_path / "console.sock"
    proc, port = _serve(tmp_path, f"unix:{path}", "--workers", "2", store=pg.fresh_url())
    served.append(proc)
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as main,
        httpx.Client(base_url="http://console", transport=httpx.HTTPTransport(uds=str(path))) as console,
    ):
        _apart(main, console)


def test_another_asgi_server_refuses_a_listener_it_cannot_serve(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        f'[store]\nurl = "sqlite:///{tmp_path}/router.db"\n[console]\nlisten = "127.0.0.1:{free_port()}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-c", "import router.asgi"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ROUTER_CONFIG": str(config)},
    )
    assert out.returncode != 0 and "[console] listen is served by `router serve` only" in out.stderr


def test_a_listener_that_is_neither_host_port_nor_unix_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text('[console]\nlisten = "8081"\n')
    out = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "console.listen" in out.stderr and "'8081'" in out.stderr
