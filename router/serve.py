"""Running the app under hypercorn, in this process (uvloop when installed)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from router.types import ASGIApp


def hypercorn_config(host: str, port: int, graceful_timeout: float = 30.0, keep_alive_timeout: float = 75.0) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = keep_alive_timeout  # also bounds a request head sent byte by byte
    config.backlog = 4096
    config.graceful_timeout = graceful_timeout  # SIGTERM: open streams get this long to finish
    config.h11_max_incomplete_size = 16 * 1024  # request line + headers
    return config


async def serve(app: ASGIApp, host: str, port: int, started: Callable[[], Awaitable[None]] | None = None,
                graceful_timeout: float = 30.0, keep_alive_timeout: float = 75.0) -> None:  # fmt: skip
    """Serve until SIGINT/SIGTERM; then stop accepting, let open requests finish (up to
    ``graceful_timeout``), run the app's shutdown (which settles every call), and return."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    config = hypercorn_config(host, port, graceful_timeout, keep_alive_timeout)
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
