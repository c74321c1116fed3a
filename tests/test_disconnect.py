"""A caller who disconnects mid-stream stops the upstream read at once."""

from __future__ import annotations

import socket
import time

from tests.conftest import Stack, http_post


def test_disconnect_stops_the_upstream(stack: Stack) -> None:
    key = stack.key()
    body = (
        b'{"model":"openai/gpt-4o-mini","stream":true,'
        b'"messages":[{"role":"user","content":"long [tokens:200] [delay:50]"}]}'
    )
    request = http_post(key, body)
    emulator = stack.emulator("openai")
    before = len(emulator.streams)
    sock = socket.create_connection(("127.0.0.1", stack.port))
    sock.sendall(request)
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(65536)
    sock.close()
    closed_at = time.monotonic()
    deadline = closed_at + 5
    while len(emulator.streams) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(emulator.streams) > before, "the upstream stream never ended"
    outcome, events = emulator.streams[-1]
    assert outcome == "disconnected"
    assert events < 20  # of ~200: the upstream was dropped within a few 50 ms gaps
    assert time.monotonic() - closed_at < 1.5
