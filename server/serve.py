"""Running the app under hypercorn, in this process (uvloop when installed), or in several worker
processes that share one listening socket (``router serve --workers N``)."""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from wsgiref.handlers import format_date_time

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from core.catalog import ConfigError
from core.config import ServerSettings
from core.types import ASGIApp
from server import channels, connections, fast_h2, fast_http1


class _Config(Config):
    """hypercorn's settings, with the headers it adds to every response made once a second: it
    formatted the Date header for each response (wsgiref's format_date_time, ~1 % of a call), and
    named itself in a Server header (dropped: a gateway has no reason to advertise its server)."""

    include_server_header = False
    _date: tuple[int, tuple[bytes, bytes]] = (0, (b"date", b""))

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, (b"date", format_date_time(now).encode("ascii")))
        return [self._date[1]]  # a new list: hypercorn extends it


def hypercorn_config(server: ServerSettings) -> Config:
    config = _Config()
    config.bind = [f"{server.host}:{server.port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = server.keep_alive_timeout  # also bounds a request head sent byte by byte
    config.backlog = 4096
    config.graceful_timeout = server.graceful_timeout  # SIGTERM: open streams get this long to finish
    config.h11_max_incomplete_size = 16 * 1024  # request line + headers
    return config


VERIFIED = ("0.18.",)  # the hypercorn releases the fast path was verified on (pyproject.toml pins them)


def hypercorn_version() -> str:
    return importlib.metadata.version("hypercorn")


def check_hypercorn(version: str) -> None:
    """The fast path replaces some of hypercorn's internals: another release may differ in them."""
    if not version.startswith(VERIFIED):
        raise ConfigError(
            f"the server's fast path was verified on hypercorn {', '.join(v + 'x' for v in VERIFIED)}, "
            f"not {version}: install the locked one (make install), or set [server] fast_path = false"
        )


def install_server_layer(server: ServerSettings) -> None:
    """hypercorn as the gateway runs it: its connections bounded and let go of when the client goes
    (server.connections), HTTP/1.1 read by httptools instead of h11 (server.fast_http1), and its
    per-request steps in fewer instructions and less memory (server.fast_h2, channels), each held
    equal to the original by its tests. For the whole process (the test suite's servers run on it too).
    ``[server] fast_path = false``: stock hypercorn, untouched (any release)."""
    if not server.fast_path:
        return
    check_hypercorn(hypercorn_version())
    connections.install(server.max_connections, server.max_idle_connections)
    fast_http1.install()
    fast_h2.install()
    channels.install()


async def serve(
    app: ASGIApp,
    server: ServerSettings,
    started: Callable[[], Awaitable[None]] | None = None,
    fd: int | None = None,
    *,
    on_reload: Callable[[], object] | None = None,
    console: tuple[str, ASGIApp] | None = None,
    console_fd: int | None = None,
) -> None:
    """Serve on ``server.host:port`` until SIGINT/SIGTERM; then stop accepting, let open requests
    finish (up to ``graceful_timeout``), run the app's shutdown (which settles every call), and
    return. Client connections are bounded and closed when the client goes (server/connections.py).
    SIGHUP calls ``on_reload``. ``console``, an address and an app, is served on that address too
    (on ``console_fd``, its socket, when given), in this process, until the same signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    if on_reload is not None:
        try:
            loop.add_signal_handler(signal.SIGHUP, on_reload)
        except (NotImplementedError, RuntimeError):
            pass
    config = hypercorn_config(server)
    install_server_layer(server)
    if fd is not None:
        config.bind = [f"fd://{fd}"]  # a worker of serve_workers: the socket is its parent's
    listeners = [(app, config)]
    if console is not None:  # an app of its own on a listener of its own
        bind, second = console
        own = hypercorn_config(server)
        own.bind = [f"fd://{console_fd}" if console_fd is not None else bind]
        own.umask = 0o177  # a Unix socket: only this user may connect
        listeners.append((second, own))
    # hypercorn types the ASGI scope and messages as TypedDicts, Starlette and we as mutable mappings:
    # the same dicts at run time, two spellings mypy cannot reconcile
    tasks = [asyncio.ensure_future(hypercorn_serve(a, c, shutdown_trigger=stop.wait)) for a, c in listeners]  # type: ignore[arg-type]
    task = tasks[0]
    if started is not None:
        await answering(server.host, server.port, task)
        await started()
    await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()  # one listener failed (its address in use, say): the other stops too
    for done in tasks:
        await done


async def answering(host: str, port: int, server: asyncio.Future[None]) -> None:
    """Return once ``host:port`` answers ``GET /healthz`` with 200: the port is bound and the app's
    startup succeeded. When the server stops first, what it raised is raised here."""
    probe = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 (where to connect, not a bind)
    while not server.done():
        try:
            reader, writer = await asyncio.open_connection(probe, port)
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
                status = await asyncio.wait_for(reader.readline(), 10)
            finally:
                writer.close()
            if status.startswith(b"HTTP/1.1 200"):
                return
        except (OSError, TimeoutError):
            pass
        await asyncio.wait([server], timeout=0.05)
    await server
    raise RuntimeError(f"the server on {host}:{port} stopped before it answered")


# Cyclic GC for a serving process. With the default thresholds (700, 10, 10) a full collection
# starts whenever the survivors of younger ones add up, and with thousands of calls in flight the
# heap is large: bench.streams (5,000 open streams) measured 40 full collections of up to 0.9 s
# each, every one finding nothing to free, and each one stops every stream. Survivors here are
# in-flight calls, not garbage; reference cycles are rare (exceptions' tracebacks) and still
# collected, just less often. gc.freeze() also keeps what exists at startup (modules, catalog,
# settings) out of every later collection.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """For a process that serves the gateway (``router serve``, ``router.asgi``); an application
    that mounts the gateway keeps its own settings."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(main: Coroutine[Any, Any, None]) -> None:
    tune_gc()
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:
        asyncio.run(main)


def serve_workers(
    server: ServerSettings,
    workers: int,
    argv: Callable[[int, int | None], list[str]],
    console: str | None = None,
) -> int:
    """Bind ``server.host:port`` (and ``console``, an address, when given) once and run ``workers``
    processes, ``argv(fd, console_fd)``, that all accept on those sockets (the kernel spreads
    connections over them). SIGTERM/SIGINT go to every worker, each of which finishes its open
    requests, and SIGHUP too; returns the first non-zero exit status, else 0."""
    host, port = server.host, server.port
    children: list[subprocess.Popen[bytes]] = []
    forwarded: set[int] = set()

    def forward(signum: int, frame: object) -> None:
        forwarded.add(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # the handlers go in before the port is bound: a SIGTERM as soon as it accepts is a clean stop
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)

    def reload_all(signum: int, frame: Any) -> None:  # each worker reloads
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGHUP, reload_all)
    sock = socket.create_server((host, port), backlog=4096)
    sock.set_inheritable(True)
    socks = [sock]
    if console:  # the second listener, shared the same way
        own = hypercorn_config(server)
        own.bind, own.umask = [console], 0o177
        socks += own.create_sockets().insecure_sockets
        socks[-1].listen(own.backlog)
    command = argv(sock.fileno(), socks[-1].fileno() if console else None)
    for _ in range(workers):
        if forwarded:  # stopped while starting: no more workers
            break
        children.append(subprocess.Popen(command, pass_fds=[s.fileno() for s in socks]))  # noqa: S603 (our own command line)
    for s in socks:
        s.close()  # the workers hold them now
    for child in children:  # a signal that came while they were being started reaches them too
        if forwarded and child.poll() is None:
            child.send_signal(next(iter(forwarded)))
    print(
        f"router: {workers} workers on http://{host}:{port} (pids {', '.join(str(c.pid) for c in children)})",
        file=sys.stderr,
        flush=True,
    )
    codes = [exit_status(child.wait(), forwarded) for child in children]
    return next((code for code in codes if code), 0)


def exit_status(returncode: int, forwarded: set[int]) -> int:
    """A worker's exit as the parent reports it. A worker still starting (before its handlers are
    in) dies of the SIGTERM/SIGINT we forwarded: it had nothing in flight, so that is a clean stop.
    Any other death by signal is 128 + the signal, as a shell reports it."""
    if returncode >= 0:
        return returncode
    return 0 if -returncode in forwarded else 128 - returncode
