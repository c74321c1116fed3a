"""Fixtures as factories. The main one, ``stack``, is the real thing on loopback: the five emulated
providers and the gateway under hypercorn, in a background thread with its own event loop (so the
synchronous OpenAI SDK can call it from the test), on a SQLite store in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import redis

from billing.backends import open_store
from billing.store import Store
from cli.demo import with_emulators
from core.catalog import NANO
from core.config import ReliabilitySettings, ServerSettings, Settings, StoreSettings
from core.deployments import Deployment
from emulators.common import Emulator
from emulators.common import serve as serve_emulator
from emulators.registry import Running, start_emulators, stop_emulators
from gateway.auth import new_key
from router.app import create_app
from router.logs import JsonFormatter
from server.serve import hypercorn_config, install_server_layer

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
# the product's packages, in the order of their layers (pyproject.toml's import contracts; Makefile's PACKAGES)
PRODUCT_PACKAGES = (
    "core",
    "server",
    "adapters",
    "billing",
    "emulators",
    "gateway",
    "jobs",
    "console",
    "router",
    "cli",
)

# What a test starts besides one gateway and the emulators, as its markers: `make test-fast` runs the
# tests that have none. The fixtures that start a service name it; so do the modules whose tests start
# it themselves, and the ones that run whole processes or generated input at length (slow).
STARTED_BY = {
    "pg": "postgres",
    "pg_url": "postgres",
    "redis_prefix": "redis",
    "redis_server": "redis",
    "browser": "browser",
    "report": "node",
}
STARTED_IN = {
    "test_postgres": "postgres",
    "test_budgets_replicas": "postgres",
    "test_redis_faults": "redis",
    "test_console_browser": "browser",
    "test_client_matrix": "node",
    "test_console_sso": "node",
    "test_claude_code": "agent",
    "test_codex": "agent",
    **dict.fromkeys(
        [
            "test_openapi",
            "test_alerts",
            "test_connections",
            "test_faults",
            "test_hard_kill",
            "test_crash",
            "test_soak",
            "test_cli",
            "test_admin_listener",
            "test_demo",
            "test_shutdown",
            "test_reload",
            "test_readme",
            "test_stock_server",
            "test_media_faults",
            "test_key_lifecycle",
            "test_operators",
            "test_audit",
            "test_batches",
            "test_budgets",
            "test_fast_headers",
            "test_fast_http1",
            "test_malformed",
            "test_client_langchain",
            "test_client_agents",
            "test_http2",
        ],
        "slow",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        started = {STARTED_BY[name] for name in item.fixturenames if name in STARTED_BY}  # type: ignore[attr-defined]
        if callspec is not None and "postgres" in callspec.params.values():
            started.add("postgres")
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""  # type: ignore[attr-defined]
        if module in STARTED_IN:
            started.add(STARTED_IN[module])
        for name in started:
            item.add_marker(name)


ONE_PER_PROVIDER = [  # a model of each provider group (p1..p5)
    "openai/gpt-4o-mini",
    "anthropic/claude-haiku-4-5",
    "google/gemini-2.5-flash",
    "upstage/solar-mini",
    "mistral/mistral-small-latest",
]
_names = itertools.count(1)


@contextlib.asynccontextmanager
async def hypercorn_on(
    app: Any, **streams: Any
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``app`` served by hypercorn on a free loopback port (with whatever server layer the process has
    installed), and a client connection to it (``streams``: asyncio.open_connection's keywords); the
    server is stopped when the block ends."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.errorlog = None
    stop = asyncio.Event()
    server = asyncio.ensure_future(serve(app, config, shutdown_trigger=stop.wait))
    try:
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, **streams)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("hypercorn did not start")
        try:
            yield reader, writer
        finally:
            writer.close()
    finally:
        stop.set()
        await server


def h2_get(path: str) -> list[tuple[bytes, bytes]]:
    """An HTTP/2 GET's headers, pseudo-headers first."""
    return [
        (b":method", b"GET"),
        (b":path", path.encode()),
        (b":scheme", b"http"),
        (b":authority", b"localhost"),
    ]


def h2_chat(key: str) -> list[tuple[bytes, bytes]]:
    """The headers of an HTTP/2 POST /v1/chat/completions with ``key``."""
    return [
        (b":method", b"POST"),
        (b":path", b"/v1/chat/completions"),
        (b":scheme", b"http"),
        (b":authority", b"localhost"),
        (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", b"application/json"),
    ]


async def h2_exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    requests: list[tuple[list[tuple[bytes, bytes]], bytes | None]],
    window: int = 65_535,
    cancel: dict[int, int] | None = None,
    cancel_connection_after: int | None = None,
) -> list[tuple[int, bytes]]:
    """HTTP/2 with prior knowledge (the h2 library's client) on an open connection: each request
    (headers with the pseudo-headers, and a body or None) on its own stream, all at once, with
    ``window`` as the client's initial flow-control window. ``cancel``: request index -> the stream is
    reset (CANCEL) once that many DATA frames of it arrived; ``cancel_connection_after``: the socket is
    dropped (no GOAWAY) once that many DATA frames arrived in all, and AssertionError raised. Returns
    (status, body) in request order."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        },
    )
    conn.initiate_connection()
    index: dict[int, int] = {}
    for i, (headers, body) in enumerate(requests):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            conn.send_data(sid, body, end_stream=True)
        index[sid] = i
    writer.write(conn.data_to_send())
    status = [0] * len(requests)
    got = [bytearray() for _ in requests]
    frames = [0] * len(requests)
    cancel = cancel or {}
    open_ = set(index)
    while open_:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, "the server closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status[index[event.stream_id]] = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                i = index[event.stream_id]
                got[i] += event.data
                frames[i] += 1
                if cancel_connection_after is not None and sum(frames) >= cancel_connection_after:
                    writer.transport.abort()
                    raise AssertionError("the client dropped the connection")
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if frames[i] == cancel.get(i) and event.stream_id in open_:
                    conn.reset_stream(event.stream_id)
                    open_.discard(event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                open_.discard(event.stream_id)
            elif isinstance(event, h2.events.StreamReset) and event.stream_id in open_:
                raise AssertionError(f"request {index[event.stream_id]} reset by the server")
        writer.write(conn.data_to_send())
    return [(s, bytes(b)) for s, b in zip(status, got, strict=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """Emulators + gateway on loopback. ``run`` executes a coroutine on the stack's loop.

    ``extra``: more emulator instances (a provider's several deployments), started before the gateway
    on free ports; ``configure`` then gets their URLs (``http://127.0.0.1:PORT``, by name) and returns
    the gateway's settings."""

    def __init__(
        self,
        tmp: Path,
        settings: Settings | None = None,
        extra: dict[str, Emulator] | None = None,
        configure: Callable[[dict[str, str]], Settings] | None = None,
    ) -> None:
        self.tmp = tmp
        self.extra = extra or {}
        self.extra_urls: dict[str, str] = {}
        self._configure = configure
        self._extra_runners: list[Any] = []
        # the shared stack does not retry and never opens a circuit: the fault tests stay independent
        # (tests/test_reliability.py builds its own stacks for those)
        self.base_settings = settings or Settings(
            store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
            reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack", daemon=True)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._stop: asyncio.Event | None = None
        self._served: asyncio.Future[None] | None = None
        self.clients: list[Any] = []  # SDK clients (OpenAI's, Anthropic's): closed after each test

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """``coro`` on the stack's loop, once every settlement the gateway has queued is durable
        (answers do not wait for their settlement: billing/ledger.py), so a test reads what it did."""

        async def settled_then() -> T:
            gateway = getattr(self, "gateway", None)
            if gateway is not None:
                await gateway.ledger.drain()
            return await coro

        return asyncio.run_coroutine_threadsafe(settled_then(), self.loop).result(timeout)

    def start(self) -> Stack:
        self.thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        from hypercorn.asyncio import serve

        self.emulators: dict[str, Running] = await start_emulators()
        for name, emulator in self.extra.items():
            runner, port = await serve_emulator(emulator.app)
            self._extra_runners.append(runner)
            self.extra_urls[name] = f"http://127.0.0.1:{port}"
        if self._configure is not None:
            self.base_settings = self._configure(self.extra_urls)
        self.settings = with_emulators(self.base_settings, self.emulators)
        self.store: Store = open_store(self.settings.store.url)
        await self.store.open()
        self.app = create_app(self.settings)
        self.gateway = self.app.state.gateway
        self._stop = asyncio.Event()
        server = ServerSettings(port=self.port)
        install_server_layer(server)  # the gateway's server layer, as server.serve runs it
        config = hypercorn_config(server)
        config.errorlog = None
        config.graceful_timeout = 1.0
        self._served = asyncio.ensure_future(serve(self.app, config, shutdown_trigger=self._stop.wait))  # type: ignore[arg-type]
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return
            except OSError:
                await asyncio.sleep(0.02)
        raise RuntimeError("gateway did not start")

    def stop(self) -> None:
        async def _stop() -> None:
            assert self._stop is not None and self._served is not None
            self._stop.set()
            await self._served
            await self.store.close()
            await stop_emulators(self.emulators)
            for runner in self._extra_runners:
                await runner.cleanup()

        self.run(_stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    # -- factories --------------------------------------------------------------------------------
    def group(self, credits: float | int = 100, name: str | None = None) -> str:
        name = name or f"g{next(_names)}"
        self.run(self.store.create_group(name, int(credits * NANO)))
        return name

    def key(self, credits: float | int = 100, group: str | None = None, **kw: Any) -> str:
        group = group or self.group(credits)
        key, _ = self.run(new_key(self.store, self.settings, group, kw.pop("name", "test"), **kw))
        return key

    def client(self, key: str | None = None, **kw: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.base_url, api_key=key or self.key(), max_retries=0, **kw)
        self.clients.append(client)
        return client

    def anthropic_client(self, key: str | None = None, **kw: Any) -> Any:
        """Anthropic's SDK on the gateway's Messages API."""
        import anthropic

        client = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{self.port}", api_key=key or self.key(), max_retries=0, **kw
        )
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        while self.clients:
            self.clients.pop().close()

    def async_client(self, key: str | None = None, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=key or self.key(), max_retries=0, **kw)

    def emulator(self, prefix: str) -> Any:
        return self.emulators[prefix].emulator


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack")).start()
    yield s
    s.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    yield stack.client()
    stack.close_clients()


def use_deployment(gateway: Any, deployment: Deployment) -> Deployment:
    """Serve ``deployment``'s provider group with it alone, from now on (a test swapping an upstream:
    another address, key or timeout); returns the one it replaces."""
    from core.config import ProviderSettings
    from gateway.dispatch import Pool

    prefix = deployment.prefix
    old = gateway.providers[prefix]
    gateway.providers[prefix] = deployment
    gateway.deployments[prefix] = [deployment]
    gateway.dispatcher.pools[prefix] = Pool(prefix, [deployment], ProviderSettings(), gateway.catalog)
    return old


class Raw:
    """A raw HTTP exchange with the gateway (stdlib http.client): for wire-level assertions."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        import json

        return json.loads(self.body)


def raw_request(
    stack: Stack, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> Raw:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=30)
    try:
        try:
            conn.request(method, path, body=body, headers=headers or {})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (413) before reading all of a large body: read its answer
        resp = conn.getresponse()
        return Raw(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def http_post(key: str, body: bytes, path: str = "/v1/chat/completions", close: bool = False) -> bytes:
    """The bytes of an HTTP/1.1 POST of ``body`` as ``key``, for tests that read (or break off) the
    answer on a socket of their own."""
    head = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(["Connection: close"] if close else []),
    ]
    return "\r\n".join([*head, "", ""]).encode() + body


def break_off(port: int, request: bytes, marker: bytes, count: int) -> None:
    """Send ``request`` on a socket of its own, read the answer until ``marker`` has come ``count``
    times, then hang up: a caller breaking a stream off."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        received = b""
        while received.count(marker) < count:
            received += sock.recv(65536)


def wait_healthy(
    port: int, proc: subprocess.Popen[bytes], log: Path | None = None, seconds: float = 30
) -> None:
    """Return once the gateway process on ``port`` answers ``GET /healthz``; fail (with its log) if it
    exits or takes longer than ``seconds`` (then it is killed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"gateway on port {port} exited with {proc.returncode}: {log.read_text() if log else ''}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    proc.kill()  # (a test that fails here must not leave a server running for the rest of the suite)
    proc.wait(10)
    raise AssertionError(f"gateway on port {port} did not start: {log.read_text() if log else ''}")


@pytest.fixture(autouse=True)
def _close_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "stack" in request.fixturenames:
        request.getfixturevalue("stack").close_clients()


# -- PostgreSQL (CI has one on 127.0.0.1:5432: tests of that backend run there, never skip) -------------
ADMIN_URL = os.environ.get("ROUTER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """A coroutine on a loop of its own (sync fixtures; never inside a running loop)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def pg_admin(url: str, *statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


_schemas = itertools.count(1)


class Postgres:
    """The session's test database; ``fresh_url()`` gives each test an empty schema of its own."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.admin_url = admin_url
        self.database = database
        self.url = f"{admin_url.rsplit('/', 1)[0]}/{database}"

    def fresh_url(self) -> str:
        schema = f"t{next(_schemas)}"
        run_sync(pg_admin(self.url, f"CREATE SCHEMA {schema}"))
        return f"{self.url}?search_path={schema}"


@pytest.fixture(scope="session")
def pg() -> Iterator[Postgres]:
    """A throwaway database for the session's PostgreSQL tests (dropped after); they never skip."""
    import asyncpg

    database = f"router_test_{secrets.token_hex(4)}"
    try:
        run_sync(pg_admin(ADMIN_URL, f"CREATE DATABASE {database}"))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {ADMIN_URL} ({type(exc).__name__}: {exc}). "
            "The PostgreSQL tests need a server there (or its URL in $ROUTER_TEST_POSTGRES); "
            "they do not skip.",
            pytrace=False,
        )
    try:
        yield Postgres(ADMIN_URL, database)
    finally:
        run_sync(pg_admin(ADMIN_URL, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store of each kind: a SQLite file, a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/router.db"
    postgres: Postgres = request.getfixturevalue("pg")
    return postgres.fresh_url()


REDIS_URL = "redis://127.0.0.1:6379/0"  # the machine's Redis (CI starts it)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh namespace in the machine's Redis per test, its keys deleted afterwards."""
    prefix = f"test:{secrets.token_hex(6)}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for name in client.scan_iter(match=prefix + "*"):
            client.delete(name)
    finally:
        client.close()


def metric(stack: Stack, sample: str) -> float:
    """The value of one sample of /metrics (0 if absent): metrics belong to the process, so tests
    compare before and after."""
    for line in raw_request(stack, "GET", "/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def find(self, request_id: str, seconds: float = 5) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # written after the last byte went out
            for line in self.lines:
                entry = json.loads(line)
                if entry.get("request_id") == request_id:
                    return entry
            time.sleep(0.01)
        raise AssertionError(f"no access-log line for {request_id}")


@pytest.fixture
def access_lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("router.access")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def older_hold(store: Any, group_id: int, key_id: int, amount: int) -> Any:
    """A reservation row in a SQLite store, as versions that reserved in the store left them (this one holds
    its reservations in memory: billing.ledger.LocalLedger); settled or reconciled like any other."""
    from billing.store import Reservation

    def hold(db: Any) -> Reservation:
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "UPDATE groups SET balance = balance - ?, reserved = reserved + ? WHERE id = ?",
            (amount, amount, group_id),
        )
        db.execute("UPDATE keys SET reserved = reserved + ? WHERE id = ?", (amount, key_id))
        rid = db.execute(
            "INSERT INTO reservations (group_id, key_id, amount, created_at) VALUES (?, ?, ?, ?)",
            (group_id, key_id, amount, time.time()),
        ).lastrowid
        db.execute("COMMIT")
        return Reservation(rid, group_id, key_id, amount)

    return await store.run(hold)
