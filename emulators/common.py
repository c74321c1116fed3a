"""What every emulator is made of: the key it accepts, its aiohttp app, the last request bodies it
received and their headers (for tests), JSON codecs, ids, and writing a stream as the fault directives want it
(:mod:`emulators.directives`)."""

from __future__ import annotations

import asyncio
import math
import secrets
import string
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web

from emulators.directives import Directives

encode = msgspec.json.Encoder().encode
# under Azure's URL shape (emulators/azure.py), the model the request's deployment serves
DEPLOYED = web.RequestKey("azure_model", str)
decode = msgspec.json.Decoder().decode


class Rpm:
    """A provider's requests-per-minute limit, enforced the way providers say they do it: over short
    periods (a limit of 600 RPM admits about 10 requests in any second, not 600 at once). ``wait()``
    is None for a request admitted (and counted), else the seconds until one would be."""

    BURST = 1.0  # seconds' worth of requests admitted back to back

    def __init__(self, rpm: int = 0, clock: Any = time.monotonic) -> None:
        self.rpm = rpm
        self.clock = clock
        self._tat = 0.0  # theoretical arrival time of the next request (GCRA)

    def wait(self) -> float | None:
        if not self.rpm:
            return None
        now = self.clock()
        interval = 60.0 / self.rpm
        tat = max(self._tat, now)
        allow_at = tat + interval - max(self.BURST, interval)
        if allow_at > now:
            return allow_at - now
        self._tat = tat + interval
        return None


def retry_after(seconds: float) -> str:
    """A Retry-After header's value: whole seconds, at least 1 (as the providers send it)."""
    return str(max(math.ceil(seconds), 1))


class Emulator:
    """One emulated provider: ``app`` serves its API, which accepts ``api_key``; ``requests`` keeps the
    last 50 bodies it received, ``served`` counts the requests it answered without a rate limit
    refusal and ``refused`` those it refused over its ``rpm`` (0: no limit)."""

    def __init__(self, api_key: str, max_body: int, rpm: int = 0) -> None:
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, beside ``requests``
        self.app = web.Application(client_max_size=max_body)
        self.limit = Rpm(rpm)
        self.served = 0
        self.refused = 0

    def received(self, body: dict[str, Any], headers: Any = None) -> None:
        self.requests = [*self.requests[-49:], body]
        self.headers = [*self.headers[-49:], {k.lower(): v for k, v in (headers or {}).items()}]

    def over_limit(self) -> float | None:
        """None if this request is within the emulator's RPM (it is counted as served), else the
        seconds until one would be (it is counted as refused)."""
        wait = self.limit.wait()
        if wait is None:
            self.served += 1
        else:
            self.refused += 1
        return wait


def random_id(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


async def write_bytes(response: web.StreamResponse, data: bytes, split: bool) -> None:
    if not split:
        await response.write(data)
        return
    i = 0
    step = 1
    while i < len(data):
        await response.write(data[i : i + step])
        i += step
        step = step % 3 + 1


async def pause(ms: int) -> None:
    if ms:
        await asyncio.sleep(ms / 1000)


def nth(flags: Sequence[bool], n: int) -> int | None:
    """How many frames go up to and including the ``n``-th (from 1) whose flag is set; None if fewer."""
    seen = 0
    for i, flag in enumerate(flags):
        seen += flag
        if flag and seen >= n:
            return i + 1
    return None


async def play(
    request: web.Request,
    response: web.StreamResponse,
    frames: Sequence[bytes],
    d: Directives,
    cut_after: int | None = None,
    fail: tuple[int, bytes] | None = None,
) -> tuple[str, int]:
    """Write a prepared stream's ``frames`` ``[delay:MS]`` apart, in 1-3 byte pieces under ``[split]``.
    After ``cut_after`` frames the connection is dropped (``[cut:N]``: a cut, not a clean end); with
    ``fail`` = (n, frame), ``frame`` (an in-band error) is written after n frames and the stream stops
    (``[midfail]``). Returns how it ended (complete, cut, failed, disconnected) and the frames written."""
    written = 0
    try:
        for data in frames:
            if written:
                await pause(d.delay_ms)
            if fail is not None and written == fail[0]:
                await response.write(fail[1])
                return "failed", written
            await write_bytes(response, data, d.split)
            written += 1
            if cut_after is not None and written >= cut_after:
                if request.transport is not None:
                    request.transport.close()
                return "cut", written
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        return "disconnected", written
    return "complete", written


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start ``app`` on host:port (0 picks a free port); returns the runner and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    try:
        await site.start()
    except OSError:  # the port is taken: nothing stays behind
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]
