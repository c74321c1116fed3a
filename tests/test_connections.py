"""One client cannot exhaust the server's connections (server/connections.py), through a real
``router serve`` process with a small descriptor limit so the floods are quick; and the connection's
own steps (keep-alive timer, reading loop, drain) through a real server."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from core.config import ServerSettings
from server.serve import install_server_layer
from tests.conftest import Stack, free_port, h2_chat, h2_exchange, hypercorn_on, wait_healthy
from tests.test_crash import _config_with_key

NOFILE = 400  # the served process's descriptor limit: (400 - 64) // 2 = 168 connections by default


def _serve(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    def small_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=small_limit,
        )
    wait_healthy(port, proc, log)
    return proc


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _healthz_ms(port: int) -> float:
    began = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        assert response.status == 200
    return (time.perf_counter() - began) * 1000


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_connections_closed_by_the_client_let_go_of_their_socket_at_once(
    stack: Stack, tmp_path: Path
) -> None:
    """3,000 connect-then-close cycles, many times the descriptor limit: each socket is let go when
    the client closes (hypercorn kept it in CLOSE-WAIT for keep_alive_timeout, 75 s, until the
    process ran out of descriptors and answered nothing, /healthz included)."""
    config, _ = _config_with_key(
        tmp_path, f"sqlite:///{tmp_path}/r.db", stack.emulators["openai"], "flood", 10
    )
    port = free_port()
    proc = _serve(config, port, tmp_path / "gw.log")
    try:
        before = _fds(proc.pid)
        during: list[float] = []
        for i in range(3000):
            socket.create_connection(("127.0.0.1", port)).close()
            if i % 500 == 499:
                during.append(_healthz_ms(port))
        deadline = time.monotonic() + 5
        while _fds(proc.pid) > before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fds(proc.pid) <= before + 2
        assert max(during) < 2000, during
        assert _healthz_ms(port) < 1000
    finally:
        proc.terminate()
        proc.wait(15)


def test_idle_connections_past_the_cap_make_room_for_new_ones(stack: Stack, tmp_path: Path) -> None:
    """Idle connections and half-sent request heads past max_idle_connections: the one idle longest
    is closed for each new one, so /healthz still answers and the descriptors stay bounded."""
    config, key = _config_with_key(
        tmp_path,
        f"sqlite:///{tmp_path}/r.db",
        stack.emulators["openai"],
        "idle",
        10,
        "[server]\nmax_idle_connections = 40\n",
    )
    port = free_port()
    proc = _serve(config, port, tmp_path / "gw.log")
    held: list[socket.socket] = []
    try:
        for i in range(300):  # more than the process has descriptors for
            sock = socket.create_connection(("127.0.0.1", port))
            if i % 2:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # a head never finished
            held.append(sock)
        assert _healthz_ms(port) < 1000
        assert _fds(proc.pid) < 40 + 30
        assert _metric(port, "router_connections_evicted_total") >= 300 - 40
        # a real call on a fresh connection is served
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            method="POST",
            data=json.dumps(
                {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        proc.wait(15)


def _capped_gateway(
    stack: Stack, tmp_path: Path, cap: int, prompt: str
) -> tuple[subprocess.Popen[bytes], int, str, bytes]:
    """A ``router serve`` with ``max_connections = cap``, its port, a key, and a streaming call's body."""
    config, key = _config_with_key(
        tmp_path,
        f"sqlite:///{tmp_path}/r.db",
        stack.emulators["openai"],
        "capped",
        10,
        f"[server]\nmax_connections = {cap}\n",
    )
    port = free_port()
    proc = _serve(config, port, tmp_path / "gw.log")
    body = json.dumps(
        {"model": "openai/gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    ).encode()
    return proc, port, key, body


def test_a_connection_past_the_cap_with_every_one_busy_gets_503(stack: Stack, tmp_path: Path) -> None:
    """max_connections busy with streams: the next connection is answered 503 with Retry-After (not
    left to hang or to take a descriptor the process does not have); once they end, calls are served."""
    proc, port, key, body = _capped_gateway(stack, tmp_path, 4, "hold on [tokens:8] [delay:500]")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    finished: list[int] = []
    started = threading.Semaphore(0)

    def stream() -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=headers
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            started.release()  # its head has come: a busy connection until the body ends
            response.read()
            finished.append(response.status)

    try:
        threads = [threading.Thread(target=stream) for _ in range(4)]
        for thread in threads:
            thread.start()
        for _ in threads:  # every stream has started (however loaded the machine): four busy connections
            assert started.acquire(timeout=30)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 503"), answer
        assert "retry-after: 1" in answer.lower() and '"code":"too_many_connections"' in answer
        for thread in threads:
            thread.join(60)
        assert finished == [200, 200, 200, 200]
        assert _healthz_ms(port) < 1000
        assert _metric(port, "router_connections_refused_total") >= 1
    finally:
        proc.terminate()
        proc.wait(15)


def test_http2_calls_past_the_descriptor_budget_get_503(stack: Stack, tmp_path: Path) -> None:
    """An HTTP/2 connection carries many calls, each with its upstream socket: its calls besides the
    first take one descriptor each of the budget (two per connection: max_connections = 3 is 6), so
    one connection's eight calls at once get five answers and three 503s with Retry-After, which
    never reach the gateway (an idle HTTP/1.1 connection is closed to make room first, as for a new
    connection); once the five end, the budget is whole again."""
    proc, port, key, body = _capped_gateway(stack, tmp_path, 3, "hold on [tokens:6] [delay:300]")
    request = h2_chat(key)
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)  # kept open after its answer: idle
    _answer(idle, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")

    async def calls(n: int) -> list[tuple[int, bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await h2_exchange(reader, writer, [(request, body)] * n)
        finally:
            writer.close()

    try:
        answers = asyncio.run(calls(8))
        statuses = sorted(status for status, _ in answers)
        assert statuses == [200] * 5 + [503] * 3, statuses
        assert idle.recv(1) == b""  # closed to make room for an extra stream
        for status, text in answers:
            if status == 503:
                assert b'"code":"too_many_connections"' in text
            else:
                assert text.rstrip().endswith(b"data: [DONE]")
        # the extra ones are given back as their calls end on the server (just after the client has
        # their last bytes): five at once are all answered again within a few tries
        deadline, again = time.monotonic() + 10, []
        while again != [200] * 5 and time.monotonic() < deadline:
            time.sleep(0.1)
            again = [status for status, _ in asyncio.run(calls(5))]
        assert again == [200] * 5, again
        assert _metric(port, "router_connections_refused_total") >= 3
    finally:
        idle.close()
        proc.terminate()
        proc.wait(15)


def _answer(sock: socket.socket, request: bytes) -> bytes:
    """One request on ``sock`` and its whole answer (head and Content-Length body; it may come in
    several reads)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, "the connection was closed"
        data += piece
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece, "the connection was closed"
        body += piece
    return head


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closes ``sock`` (reads its answers on the way); fails past ``seconds``."""
    began = time.monotonic()
    sock.settimeout(seconds)
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open after {seconds} s") from None
        if not data:
            return time.monotonic() - began


def test_idle_connections_are_closed_after_the_keep_alive_timeout_and_at_shutdown(
    stack: Stack, tmp_path: Path
) -> None:
    """The keep-alive timer runs while a connection is idle (server/connections.py: a timer handle per
    idle period): a connection that never sent, one idle after its answers, one whose requests came
    within the timeout each time are closed keep_alive_timeout after they were last busy, not before;
    a worker shutting down closes its idle connections at once."""
    config, key = _config_with_key(
        tmp_path,
        f"sqlite:///{tmp_path}/r.db",
        stack.emulators["openai"],
        "idle",
        10,
        "[server]\nkeep_alive_timeout = 1.5\n",
    )
    port = free_port()
    proc = _serve(config, port, tmp_path / "gw.log")
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    socks: list[socket.socket] = []
    try:
        silent = socket.create_connection(("127.0.0.1", port))
        answered = socket.create_connection(("127.0.0.1", port))
        socks += [silent, answered]
        assert _answer(answered, health).startswith(b"HTTP/1.1 200")
        assert 1.0 < _closed_within(silent, 10) < 5
        assert _closed_within(answered, 10) < 5
        kept = socket.create_connection(("127.0.0.1", port))
        socks.append(kept)
        for _ in range(4):  # busy again before each timeout: the timer starts over each time
            assert _answer(kept, health).startswith(b"HTTP/1.1 200"), "closed while it was being used"
            time.sleep(1.0)
        assert _answer(kept, health).startswith(b"HTTP/1.1 200"), "closed while it was being used"
        assert 1.0 < _closed_within(kept, 10) < 5
        # a call busy for longer than the timeout (a stream of 6 events 600 ms apart) is not cut
        slow = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps(
            {
                "model": "openai/gpt-4o-mini",
                "stream": True,
                "messages": [{"role": "user", "content": "slowly [tokens:6] [delay:600]"}],
            }
        )
        slow.request(
            "POST",
            "/v1/chat/completions",
            body,
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        began = time.monotonic()
        streamed = slow.getresponse().read()
        assert streamed.rstrip().endswith(b"data: [DONE]") and time.monotonic() - began > 2, streamed[-200:]
        slow.close()
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(15)
    config.write_text(config.read_text().replace("keep_alive_timeout = 1.5", "keep_alive_timeout = 60"))
    proc = _serve(config, port, tmp_path / "gw2.log")
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    try:
        for sock in idle[:3]:
            assert _answer(sock, health).startswith(b"HTTP/1.1 200")
        began = time.monotonic()
        proc.terminate()
        proc.wait(15)
        assert time.monotonic() - began < 10  # (not the 60 s keep-alive timeout)
        for sock in idle:
            assert _closed_within(sock, 5) < 5
    finally:
        for sock in idle:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(15)


def test_a_large_answer_to_a_caller_that_stops_reading_for_a_while_arrives_whole() -> None:
    """The connection's writes wait for the socket to drain (server.connections keeps asyncio's drain
    waiters in a list; a write that leaves the socket pushing back waits, even on the short way of
    ``GuardedTCPServer.protocol_send``) and go on when the caller reads again."""
    install_server_layer(ServerSettings())
    piece = bytes(range(256)) * 256  # 64 KB
    pieces = 256  # 16 MB: far more than the sockets' buffers hold (~5 MB on loopback here)
    sent = [0]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % (len(piece) * pieces))],
            }
        )
        for _ in range(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            sent[0] += 1
        await send({"type": "http.response.body", "body": b""})

    async def main() -> int:
        async with hypercorn_on(app, limit=2**16) as (reader, writer):
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(0.5)  # not reading: the server's writes fill the buffers and wait
            assert sent[0] < pieces, (
                sent
            )  # they waited: the rest waits for the caller  # they waited (a few MB at most went to the buffers)
            got = 0
            while got < len(piece) * pieces:
                data = await reader.read(2**16)
                assert data
                got += len(data)
            return got

    assert asyncio.run(main()) == len(piece) * pieces
