"""``router serve``: the gateway's app on the server (server/serve.py), which knows no gateway: what the
gateway asks of it is said here. SIGHUP reloads the configuration; ``[console] listen`` is a second app
on a second listener; several workers need a store they can share."""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from core.catalog import ConfigError
from core.config import ServerSettings, Settings
from router.app import create_app
from server.serve import run, serve, serve_workers

if TYPE_CHECKING:
    from gateway.state import Gateway


def main(args: argparse.Namespace, settings: Settings, config: str | None) -> None:
    server = msgspec.structs.replace(
        settings.server, host=args.host or settings.server.host, port=args.port or settings.server.port
    )
    workers = args.workers or server.workers
    if workers > 1 and args.fd is None:
        raise SystemExit(workers_of(settings, config, server, workers))
    app = create_app(settings)
    app.state.gateway.config_path = config  # what SIGHUP and the admin API's reload read again
    run(
        serve(
            app,
            server,
            fd=args.fd,
            on_reload=partial(reload, app.state.gateway),
            console=app.state.console_listener,
            console_fd=args.console_fd,
        )
    )


def reload(gateway: Gateway) -> None:
    """SIGHUP: apply the configuration file again to new calls; one that does not load changes nothing."""
    log = logging.getLogger("router")
    try:
        pending = gateway.reload_file()
    except ConfigError as exc:
        log.error("configuration not reloaded: %s", exc)
        return
    log.warning("configuration reloaded%s", f"; at the next restart: {', '.join(pending)}" if pending else "")


def workers_of(settings: Settings, config: str | None, server: ServerSettings, workers: int) -> int:
    """``router serve`` in ``workers`` processes on one socket (server.serve.serve_workers), each a
    ``router serve --fd N`` of the same configuration; refused (2) on SQLite."""
    if settings.store.url.startswith("sqlite"):
        print(
            "router: several workers need a store they can share: set [store] url to a PostgreSQL URL "
            "(SQLite takes one gateway process per database file)",
            file=sys.stderr,
            flush=True,
        )
        return 2
    if not settings.limits.redis_url:
        print(
            f"router: note: without [limits] redis_url each of the {workers} workers keeps its own rate "
            "limit buckets (a key may get up to that many times its limits)",
            file=sys.stderr,
        )

    def argv(fd: int, console_fd: int | None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cli",
            *(["--config", config] if config else []),
            "serve",
            "--host",
            server.host,
            "--port",
            str(server.port),
            "--fd",
            str(fd),
            *(["--console-fd", str(console_fd)] if console_fd is not None else []),
        ]

    listen = settings.console.listen if settings.console.enabled else ""
    return serve_workers(server, workers, argv, listen or None)
