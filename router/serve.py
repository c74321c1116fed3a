"""Running the app under hypercorn, in this process (uvloop when installed)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from router.types import ASGIApp


def hypercorn_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = 75
    config.backlog = 4096
    config.graceful_timeout = 30
    return config


async def serve(app: ASGIApp, host: str, port: int, started: Callable[[], Awaitable[None]] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    config = hypercorn_config(host, port)
    task = asyncio.ensure_future(hypercorn_serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    if started is not None:
        await asyncio.sleep(0.2)
        await started()
    await task


def run(main: Awaitable[None]) -> None:
    try:
        import uvloop

        uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]
