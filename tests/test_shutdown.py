"""SIGTERM during open streams: every stream completes and is billed, then the process exits."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

from tests.conftest import Stack, free_port, http_post
from tests.test_crash import _cli, _config_with_key, _serve


def _stream(port: int, key: str, out: list[bytes], started: threading.Event) -> None:
    body = (
        b'{"model":"openai/gpt-4o-mini","stream":true,'
        b'"messages":[{"role":"user","content":"drain me [tokens:20] [delay:80]"}]}'
    )
    request = http_post(key, body, close=True)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        sock.settimeout(20)
        data = b""
        while piece := sock.recv(65536):
            data += piece
            if b"data: {" in data:
                started.set()
        out.append(data)


def test_sigterm_lets_open_streams_finish_and_bills_them(stack: Stack, tmp_path: Path) -> None:
    config, key = _config_with_key(
        tmp_path, f"sqlite:///{tmp_path}/drain.db", stack.emulators["openai"], "drain", 10
    )
    port = free_port()
    proc = _serve(config, port)
    results: list[bytes] = []
    events = [threading.Event() for _ in range(5)]
    threads = [threading.Thread(target=_stream, args=(port, key, results, e)) for e in events]
    try:
        for t in threads:
            t.start()
        for e in events:
            assert e.wait(10)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        refused = False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            refused = True
        for t in threads:
            t.join(20)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert refused  # stopped accepting at once
    assert len(results) == 5
    for data in results:
        assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), data[-200:]  # complete, chunked end
        assert data.count(b'"finish_reason":"stop"') == 1
    usage = _cli(config, "usage", "--group", "drain")
    assert usage.count(" ok ") == 5 and "interrupted" not in usage
    shown = _cli(config, "groups", "show", "drain")
    assert "reserved  0 credits" in shown and "spent     0 credits" not in shown
