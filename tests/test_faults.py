"""The ledger under store faults, through the real server and a real store (docs/operations.md, "Faults").

After each fault: every answered call has its usage record (calls answered == calls charged), the
usage records' credits add up to what left the balance, no hold is left, and the only 5xx is 503
``store_unavailable``. Each test prints its figures (``pytest -s tests/test_faults.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from billing.backends import open_store
from billing.store import Hold, Refusal, Reservation, UsageRecord
from core import metrics
from core.catalog import NANO
from core.config import ReliabilitySettings, Settings, StoreSettings
from tests.conftest import Postgres, Stack, free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-4o-mini"
GRACE = float(os.environ.get("ROUTER_TEST_LEASE_GRACE", "3"))  # the kill test's lease grace (default 30 s in
# production; set this to 30 to measure that)


@dataclass
class Tally:
    """What the callers saw."""

    ok: int = 0
    unavailable: int = 0  # 503 store_unavailable
    other: list[str] = field(default_factory=list)  # anything else: a failure of the test

    def add(self, outcome: str) -> None:
        if outcome == "ok":
            self.ok += 1
        elif outcome == "store_unavailable":
            self.unavailable += 1
        else:
            self.other.append(outcome)


async def call(client: openai.AsyncOpenAI, content: str = "[tokens:20] hello", stream: bool = False) -> str:
    try:
        if stream:
            chunks = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=50, stream=True
            )
            async for _ in chunks:
                pass
        else:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=50
            )
        return "ok"
    except openai.APIStatusError as exc:
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        if exc.status_code == 503 and code == "store_unavailable" and exc.response.headers.get("retry-after"):
            return "store_unavailable"
        return f"{exc.status_code} {code}"
    except openai.APIError as exc:
        return f"{type(exc).__name__}: {exc}"


async def load(
    base_url: str, key: str, tally: Tally, until: asyncio.Event, workers: int = 8, stream_every: int = 3
) -> None:
    """``workers`` callers in a loop until ``until`` is set (every ``stream_every``-th call streams)."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60) as client:

        async def worker(n: int) -> None:
            i = 0
            while not until.is_set():
                tally.add(await call(client, stream=(n + i) % stream_every == 0))
                i += 1

        await asyncio.gather(*(worker(n) for n in range(workers)))


async def books(url: str, group: str) -> tuple[int, int, int, list[UsageRecord]]:
    """The group's balance, reserved and spent, and its usage records (a connection of the test's own)."""
    store = open_store(url)
    await store.open()
    try:
        g = await store.get_group(group)
        assert g is not None
        return g.balance, g.reserved, g.spent, await store.usage(group=group, limit=100_000)
    finally:
        await store.close()


def check_books(
    initial: int, tally: Tally, balance: int, reserved: int, spent: int, records: list[UsageRecord]
) -> dict[str, int]:
    """The invariants after a fault; the figures for the note."""
    assert not tally.other, f"unexpected answers: {sorted(set(tally.other))[:5]}"
    charged = [r for r in records if r.status == "ok"]
    figures = {
        "answered": tally.ok,
        "charged": len(charged),
        "lost": max(tally.ok - len(charged), 0),
        "double": max(len(charged) - tally.ok, 0),
        "store_unavailable": tally.unavailable,
        "reserved": reserved,
    }
    assert len(charged) == tally.ok, figures
    assert len({r.request_id for r in charged}) == len(charged), "a call charged twice"
    assert reserved == 0, figures
    assert balance + spent == initial and spent == sum(r.credits for r in records), (balance, spent, initial)
    assert all(r.credits > 0 for r in charged)
    return figures


def counter(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


# -- PostgreSQL: the gateway's own connections terminated mid-load ----------------------------------------------
async def terminate(admin_url: str, app: str) -> int:
    """``pg_terminate_backend`` on the connections named ``app`` (the gateway's, and nobody else's)."""
    conn = await asyncpg.connect(admin_url)
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = $1 AND pid <> pg_backend_pid()",
            app,
        )
        return len(rows)
    finally:
        await conn.close()


def test_postgres_connections_killed_mid_load_fail_no_call_and_lose_no_charge(
    pg: Postgres, tmp_path: Path
) -> None:
    """Every connection of the gateway killed every 0.1 s under 12 callers: the ledger's kept connection
    is cut off mid-batch again and again (its batch may have committed). Each such batch goes again on
    another connection once the lost one's backend has ended, its reservations that committed released
    (no call of the replica knows them) and its settlements retried only if they did not; a key's
    lookup cut off goes again (a read). Before, 92 of 1,900 calls got 503 store_unavailable."""
    app = f"router-faults-{os.getpid()}"
    url = f"{pg.fresh_url()}&application_name={app}"
    settings = Settings(
        store=StoreSettings(url=url, journal=str(tmp_path / "journal.jsonl")),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        initial = 1_000 * NANO
        group = stack.group(1_000)
        key = stack.key(group=group)
        tally = Tally()
        before = counter("router_store_errors_total", operation="settle")

        async def scenario() -> int:
            until = asyncio.Event()
            running = asyncio.ensure_future(load(stack.base_url, key, tally, until, workers=12))
            killed = 0
            for _ in range(60):
                await asyncio.sleep(0.1)
                killed += await terminate(pg.url, app)
            until.set()
            await running
            return killed

        killed = asyncio.run(scenario())
        stack.run(stack.gateway.ledger.drain(), timeout=60)
        balance, reserved, spent, records = asyncio.run(books(url, group))
        figures = check_books(initial, tally, balance, reserved, spent, records)
        print(
            f"\npostgres connections killed: {killed} in 60 rounds; {figures}; "
            f"settle errors {counter('router_store_errors_total', operation='settle') - before:g}"
        )
        assert killed >= 100 and tally.ok > 300 and tally.unavailable == 0, figures
    finally:
        stack.stop()


# -- PostgreSQL: the connection lost for seconds (a TCP proxy the test cuts) ----------------------------------
class Proxy:
    """A TCP proxy to PostgreSQL, on a loop of its own, that the test can cut: every connection through
    it closed and new ones refused until :meth:`restore`. Between :meth:`hold` and :meth:`let_go`, what
    the server sends goes on at once but its close does not (a middlebox keeping the client's side open).
    With ``swallow`` set, a connection that sends it and then a ``COMMIT`` has that COMMIT passed on, the
    server's answers dropped and, 0.3 s later, is cut: the transaction committed, its client cannot know."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.down = False
        self.swallow: bytes | None = None
        self.held: asyncio.Event | None = None  # set when the closes held back may go on
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._run(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        if self.down:  # cut while this connection was being made: it is refused like the others
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        seen, muted = False, False

        def cut() -> None:
            writer.transport.abort()
            up_writer.transport.abort()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, holds: bool = False) -> None:
            nonlocal seen, muted
            try:
                while data := await src.read(65536):
                    if not holds and self.swallow is not None:
                        seen = seen or self.swallow in data
                        if seen and b"COMMIT" in data and not muted:
                            muted = True
                            self.loop.call_later(0.3, cut)
                    if holds and muted:
                        continue
                    dst.write(data)
                    await dst.drain()
                if holds and (held := self.held) is not None:
                    await held.wait()
            except OSError:
                pass
            finally:
                dst.close()
                self.writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer, holds=True))

    def cut(self) -> None:
        async def close_all() -> None:
            self.down = True
            for writer in list(self.writers):
                writer.transport.abort()

        self._run(close_all())

    def restore(self) -> None:
        self.down = False

    def hold(self) -> None:
        self.held = asyncio.Event()

    def let_go(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            self.loop.call_soon_threadsafe(held.set)

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            await self.server.wait_closed()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.cut()
        self._run(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_postgres_unreachable_for_seconds_journals_and_replays(pg: Postgres, tmp_path: Path) -> None:
    direct = pg.fresh_url()
    parts = urllib.parse.urlsplit(direct)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    url = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    settings = Settings(
        store=StoreSettings(url=url, journal=str(tmp_path / "journal.jsonl"), journal_after_seconds=1),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        initial = 1_000 * NANO
        group = stack.group(1_000)
        key = stack.key(group=group)
        tally = Tally()
        journaled, replayed = (
            counter("router_settlements_journaled_total"),
            counter("router_journal_replays_total"),
        )

        async def slow_streams() -> None:
            """Streams of about a second, begun before the cut and ended during it: their settlements
            find the store gone, whatever the load's own calls happen to be doing at the cut."""
            async with openai.AsyncOpenAI(
                base_url=stack.base_url, api_key=key, max_retries=0, timeout=60
            ) as client:
                answers = await asyncio.gather(
                    *(call(client, "[delay:50] [tokens:20] hello", stream=True) for _ in range(4))
                )
            for answer in answers:
                tally.add(answer)

        async def scenario() -> None:
            until = asyncio.Event()
            running = asyncio.ensure_future(load(stack.base_url, key, tally, until))
            await asyncio.sleep(0.7)
            slow = asyncio.ensure_future(slow_streams())
            await asyncio.sleep(0.3)
            proxy.cut()
            await slow
            await asyncio.sleep(2.0)  # longer than journal_after_seconds: settlements go to the journal
            proxy.restore()
            await asyncio.sleep(1.5)
            until.set()
            await running

        asyncio.run(scenario())
        for _ in range(200):  # replayed once the store answers again
            stack.run(stack.gateway.ledger.drain(), timeout=60)
            if not stack.gateway.ledger.durable.journal.count:
                break
            time.sleep(0.1)
        balance, reserved, spent, records = asyncio.run(books(direct, group))
        figures = check_books(initial, tally, balance, reserved, spent, records)
        went = counter("router_settlements_journaled_total") - journaled
        back = counter("router_journal_replays_total") - replayed
        print(
            f"\npostgres unreachable 3 s: {figures}; journaled {went:g}, replayed {back:g}, skipped as "
            f"committed before the cut {went - back:g}"
        )
        # a batch cut off while its COMMIT was on the wire may have committed: its journaled settlements
        # are then skipped at replay (check_books above: none lost, none charged twice)
        assert tally.unavailable > 0 and went > 0 and 0 < back <= went
        assert not stack.gateway.ledger.durable.journal.count
    finally:
        stack.stop()
        proxy.close()


# -- PostgreSQL: connections killed while they wait in the pool ----------------------------------------------
def behind(proxy: Proxy, url: str, app: str) -> str:
    """``url`` (a test schema's) through ``proxy``, its connections named ``app``."""
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)) + f"&application_name={app}"


async def kill_idle(admin_url: str, app: str, spare: int = 0) -> int:
    """``pg_terminate_backend`` on the connections named ``app`` (but ``spare``'s), once they are gone."""
    conn = await asyncpg.connect(admin_url)
    try:
        pids = [
            r[0]
            for r in await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2", app, spare
            )
        ]
        for pid in pids:
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        for _ in range(100):
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids):
                return len(pids)
            await asyncio.sleep(0.05)
        raise AssertionError("the killed backends are still there")
    finally:
        await conn.close()


def test_a_statement_refused_on_a_killed_connection_goes_again_and_one_cut_off_does_not(pg: Postgres) -> None:
    """The pool's connections killed while idle, behind a proxy that passes the server's goodbye on at
    once and its close only later (as a middlebox may): asyncpg has read the goodbye and refuses every
    statement on them before sending it. Those statements failed (StoreDown); now each goes again on a
    new connection. A statement cut off while it ran is not sent again: it may have done its work."""
    from billing.postgres_pool import PostgresPool
    from billing.store import StoreDown

    direct = pg.fresh_url()
    parts = urllib.parse.urlsplit(direct)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    app = f"router-pool-{os.getpid()}"

    async def scenario() -> None:
        db = PostgresPool(behind(proxy, direct, app), min_size=3, max_size=3)
        await db.open()
        try:
            await db.write("CREATE TABLE marks (n INTEGER NOT NULL)")
            await asyncio.gather(*(db.select("SELECT pg_sleep(0.05)") for _ in range(3)))  # three connections
            proxy.hold()
            assert await kill_idle(pg.url, app) == 3
            assert await db.select("SELECT 1") == [(1,)]
            assert await db.atomic([("INSERT INTO marks VALUES (?)", (1,))]) == [1]
            async with db.transaction() as conn:
                await conn.execute("INSERT INTO marks VALUES (2)")
            assert await db.select("SELECT n FROM marks ORDER BY n") == [(1,), (2,)]
            proxy.let_go()

            cut = asyncio.ensure_future(db.write("INSERT INTO marks SELECT 3 FROM pg_sleep(1)"))
            await asyncio.sleep(0.3)
            assert await kill_idle(pg.url, app) >= 1
            with pytest.raises(StoreDown):
                await cut
            # the cut statement's row is not there: rolled back, and not sent again
            assert await db.select("SELECT n FROM marks ORDER BY n") == [(1,), (2,)]
        finally:
            proxy.let_go()
            await db.close()

    try:
        asyncio.run(scenario())
    finally:
        proxy.close()


def test_calls_after_the_pools_connections_were_killed_are_served(pg: Postgres, tmp_path: Path) -> None:
    """``pg_terminate_backend`` on the gateway's connections while no call runs (behind the proxy of
    the test above): the next calls' keys were looked up on the killed connections and the calls got
    503 store_unavailable, though no statement of theirs had been cut. Now they are all served, each
    charged once; the ledger's own kept connection killed too (its next batch goes on another)."""
    direct = pg.fresh_url()
    parts = urllib.parse.urlsplit(direct)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    app = f"router-pool-calls-{os.getpid()}"
    store = StoreSettings(url=behind(proxy, direct, app), journal=str(tmp_path / "journal.jsonl"))
    settings = Settings(store=store, reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9))
    stack = Stack(tmp_path, settings).start()
    try:
        group = stack.group(1_000)
        keys = [stack.key(group=group) for _ in range(16)]
        tally = Tally()

        async def calls(keys: list[str]) -> None:
            clients = [
                openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)
                for key in keys
            ]
            try:
                outcomes = await asyncio.gather(*(call(c, stream=n % 2 == 0) for n, c in enumerate(clients)))
                for outcome in outcomes:
                    tally.add(outcome)
            finally:
                for client in clients:
                    await client.close()

        asyncio.run(calls(keys[:8]))  # eight lookups at once: several connections of the pool open
        assert (
            stack.gateway.store.commits.conn is not None
        )  # (the ledger's kept connection: killed with the rest)
        proxy.hold()
        killed = asyncio.run(kill_idle(pg.url, app))
        asyncio.run(calls(keys[8:]))  # eight keys not looked up yet
        proxy.let_go()
        stack.run(stack.gateway.ledger.drain(), timeout=60)
        balance, reserved, spent, records = asyncio.run(books(direct, group))
        figures = check_books(1_000 * NANO, tally, balance, reserved, spent, records)
        assert killed >= 3 and tally.ok == 16 and tally.unavailable == 0, figures
    finally:
        proxy.let_go()
        stack.stop()
        proxy.close()


def test_a_response_whose_commit_was_cut_off_is_read_back_not_said_unstored(
    pg: Postgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stored response's write committed, then its connection was lost before its client read the
    answer (behind the proxy above). The answer used to say ``store: false`` and the log "not stored",
    though the response was stored and could be retrieved; now the gateway reads it back and says so."""
    direct = pg.fresh_url()
    parts = urllib.parse.urlsplit(direct)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    store = StoreSettings(
        url=behind(proxy, direct, f"router-keep-{os.getpid()}"), journal=str(tmp_path / "j.jsonl")
    )
    stack = Stack(tmp_path, Settings(store=store, reliability=ReliabilitySettings(max_retries=0))).start()
    try:
        client = openai.OpenAI(
            base_url=stack.base_url, api_key=stack.key(group=stack.group(1_000)), max_retries=0
        )
        proxy.swallow = b"INSERT INTO responses"
        with caplog.at_level("WARNING", logger="router.responses"):
            answer = client.responses.create(model=MODEL, input="[tokens:5] hello")
        proxy.swallow = None
        lines = [r.getMessage() for r in caplog.records if answer.id in r.getMessage()]
        assert lines and "stored, though its write failed" in lines[0], lines  # (the cut happened)
        assert answer.store is True and not [line for line in lines if "not stored" in line], lines
        assert client.responses.retrieve(answer.id).output_text == answer.output_text
        client.close()
    finally:
        stack.stop()
        proxy.close()


# -- SQLite: another process holds the write lock past the busy timeout -------------------------------------
HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def test_sqlite_lock_held_past_the_busy_timeout_loses_no_charge(tmp_path: Path) -> None:
    from billing.sqlite_thread import BUSY_TIMEOUT_MS

    path = tmp_path / "router.db"
    journal = tmp_path / "journal.jsonl"
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{path}", journal=str(journal)),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        initial = 1_000 * NANO
        group = stack.group(1_000)
        key = stack.key(group=group)
        tally = Tally()
        journaled, replayed = (
            counter("router_settlements_journaled_total"),
            counter("router_journal_replays_total"),
        )
        hold = BUSY_TIMEOUT_MS / 1000 + 2  # past the gateway's busy timeout

        async def scenario() -> None:
            until = asyncio.Event()
            running = asyncio.ensure_future(load(stack.base_url, key, tally, until, workers=4))
            await asyncio.sleep(0.5)
            locker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLD_LOCK, str(path), str(hold), stdout=subprocess.PIPE
            )
            assert locker.stdout is not None
            assert (await locker.stdout.readline()).strip() == b"locked"
            await locker.wait()
            await asyncio.sleep(0.5)
            until.set()
            await running

        asyncio.run(scenario())
        for _ in range(100):  # the journal is replayed within a few seconds of the lock's release
            stack.run(stack.gateway.ledger.drain(), timeout=60)
            if not stack.gateway.ledger.durable.journal.count:
                break
            time.sleep(0.1)
        balance, reserved, spent, records = stack.run(books(f"sqlite:///{path}", group))
        figures = check_books(initial, tally, balance, reserved, spent, records)
        went = counter("router_settlements_journaled_total") - journaled
        back = counter("router_journal_replays_total") - replayed
        print(f"\nsqlite lock held {hold:g} s: {figures}; journaled {went:g}, replayed {back:g}")
        assert went > 0 and back == went and journal.read_bytes() == b""
    finally:
        stack.stop()


# -- PostgreSQL: a replica killed (SIGKILL) under load, the survivor releases its holds ----------------------
def _config(
    tmp: Path, url: str, stack: Stack, name: str, grace: float = GRACE, checkpoint: float = 5.0
) -> Path:
    openai_emulator = stack.emulators["openai"]
    path = tmp / f"{name}.toml"
    path.write_text(
        f"[store]\nurl = {json.dumps(url)}\nheartbeat_seconds = {min(grace / 6, 5):g}\n"
        f"lease_grace_seconds = {grace:g}\njournal = {json.dumps(str(tmp / f'{name}.jsonl'))}\n"
        f"checkpoint_seconds = {checkpoint:g}\n"
        f"[providers.openai]\nbase_url = {json.dumps(openai_emulator.base_url)}\n"
        f"api_key = {json.dumps(openai_emulator.api_key)}\n"
    )
    return path


def _serve(config: Path, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_healthy(port, proc, log)
    return proc, f"http://127.0.0.1:{port}/v1"


def test_a_replica_killed_under_load_has_its_holds_released_by_the_survivor(
    pg: Postgres, stack: Stack, tmp_path: Path
) -> None:
    url = pg.fresh_url()
    procs = []
    try:
        dead, dead_base = _serve(_config(tmp_path, url, stack, "a"), tmp_path, "a")
        procs.append(dead)
        survivor, survivor_base = _serve(_config(tmp_path, url, stack, "b"), tmp_path, "b")
        procs.append(survivor)
        group = "leases"
        initial = 1_000 * NANO
        key = _cli(_config(tmp_path, url, stack, "a"), group, initial)
        time.sleep(GRACE)  # the survivor has heartbeaten for a whole grace: it may judge others
        tally = Tally()

        async def scenario() -> tuple[float, int]:
            until = asyncio.Event()
            running = asyncio.ensure_future(load(survivor_base, key, tally, until, workers=4))
            async with openai.AsyncOpenAI(
                base_url=dead_base, api_key=key, max_retries=0, timeout=60
            ) as client:
                streams = [
                    await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"[delay:200] [tokens:200] hold {n}"}],
                        max_tokens=300,
                        stream=True,
                    )
                    for n in range(6)
                ]
                for s in streams:  # each has begun: its hold is in the store
                    async for chunk in s:
                        if chunk.choices and chunk.choices[0].delta.content:
                            break
                held = await holds_of_pid(url, dead.pid)
                assert held == len(streams)
                dead.send_signal(signal.SIGKILL)
                killed_at, killed_wall = time.monotonic(), time.time()
                await asyncio.to_thread(dead.wait, 10)
                for s in streams:
                    await s.close()
            # the dead replica's own holds (the group's reserved also counts the survivor's calls in flight)
            while await holds_of_pid(url, dead.pid):
                assert time.monotonic() - killed_at < 60, "the dead replica's holds were not released in 60 s"
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # the survivor keeps serving after
            until.set()
            await running
            # when the survivor released them: its records' time (this loop, busy with the load, sees it late)
            released = [r.ts for r in (await books(url, group))[3] if r.status == "interrupted"]
            return max(released) - killed_wall, held

        released_after, held = asyncio.run(scenario())
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(20)
        balance, reserved, spent, records = asyncio.run(books(url, group))
        interrupted = [r for r in records if r.status == "interrupted"]
        figures = check_books(initial, tally, balance, reserved, spent, records)
        print(
            f"\nreplica killed with {len(interrupted)} holds: released {released_after:.1f} s after the kill "
            f"(grace {GRACE:g} s); survivor {figures}"
        )
        assert len(interrupted) == 6 and tally.ok > 20
        for r in interrupted:
            assert r.model == MODEL and r.provider == "openai" and r.key_id and r.request_id
            assert r.endpoint == "chat" and r.stream  # (kept with the hold)
            assert "stopped heartbeating" in (
                r.error or ""
            )  # charged only past a checkpoint (billing/progress.py)
            assert r.credits == 0 or "at its last checkpoint" in (r.error or "")
        assert released_after < GRACE + 10
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


async def holds_of_pid(url: str, pid: int) -> int:
    """How many reservations the replica of process ``pid`` holds (its id is host:pid:tag)."""
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM reservations WHERE replica LIKE $1", f"%:{pid}:%")
        )
    finally:
        await conn.close()


def _cli(config: Path, group: str, credits: int) -> str:
    def run(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "cli", "--config", str(config), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    run("groups", "create", group, "--credits", f"{credits // NANO}")
    return run("keys", "create", "--group", group).strip().splitlines()[-1]


# -- the journal replayed at the next start, each entry once -------------------------------------------------
def test_a_journal_left_by_a_stopped_gateway_is_replayed_once_at_the_next_start(
    store_url: str, tmp_path: Path
) -> None:
    """Entries in the gateway's journal and in a sibling no process holds (a dead process's) are applied
    at start; an entry applied before (a replay cut short between the store's commit and the journal's
    rewrite) is not applied again."""
    from billing.journal import Entry, Journal, store_tag

    journal = tmp_path / "journal.jsonl"

    async def prepare() -> tuple[int, int, list[Entry]]:
        store = open_store(store_url)
        await store.open()
        try:
            group = await store.create_group("journaled", 100 * NANO)
            key = await store.create_key("journaled", "k", "0" * 64, "sk-mr-...0000")
            entries = [
                Entry.new(
                    Reservation(0, group.id, key.id, 0),
                    UsageRecord(
                        key_id=key.id,
                        group_id=group.id,
                        model=MODEL,
                        provider="openai",
                        credits=(n + 1) * NANO,
                        request_id=f"req_{n}",
                    ),
                )
                for n in range(5)
            ]
            assert await store.replay(entries[:2]) == {
                e.id: True for e in entries[:2]
            }  # applied before the crash
            return group.id, key.id, entries
        finally:
            await store.close()

    _, _, entries = asyncio.run(prepare())
    mine, orphan = (
        Journal(journal, store_tag(store_url)),
        Journal(journal.with_name("journal.jsonl.1"), store_tag(store_url)),
    )
    other = Journal(
        journal.with_name("journal.jsonl.2"), store_tag("sqlite:///another.db")
    )  # never replayed here
    other.open()
    other.append(entries[:1])
    other.close()
    for j, part in ((mine, entries[:3]), (orphan, entries[3:])):
        j.open()
        j.append(part)
        j.close()
    settings = Settings(store=StoreSettings(url=store_url, journal=str(journal)))
    stack = Stack(tmp_path, settings).start()
    try:
        assert not journal.read_bytes() and not journal.with_name("journal.jsonl.1").exists()
        assert journal.with_name("journal.jsonl.2").read_bytes().count(b"\n") == 1  # another store's: kept
        balance, reserved, spent, records = stack.run(books(store_url, "journaled"))
        assert sorted(r.request_id or "" for r in records) == [f"req_{n}" for n in range(5)]  # each once
        assert spent == (1 + 2 + 3 + 4 + 5) * NANO and balance == 100 * NANO - spent and reserved == 0
        text = urllib.request.urlopen(f"http://127.0.0.1:{stack.port}/metrics").read().decode()
        for name in (
            "router_settlements_pending",
            "router_settlements_journaled",
            "router_journal_replays_total",
            "router_settlements_journaled_total",
        ):
            assert f"\n{name} " in text, name
    finally:
        stack.stop()


def test_a_journaled_settlement_is_charged_once_whether_its_hold_was_settled_or_released(
    pg: Postgres,
) -> None:
    """Replaying on PostgreSQL: a settlement whose reservation is gone because an earlier try committed
    is skipped; one whose hold was released as a dead replica's (0 credits) is still charged."""
    from billing.journal import Entry
    from billing.leases import released_by_lease
    from billing.postgres import PostgresStore
    from billing.postgres_ledger import release

    url = pg.fresh_url()

    async def scenario() -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            group = await store.create_group("g", 100 * NANO)
            key = await store.create_key("g", "k", "1" * 64, "sk-mr-...1111")

            def record(credits: int, request_id: str) -> UsageRecord:
                return UsageRecord(
                    key_id=key.id,
                    group_id=group.id,
                    model=MODEL,
                    provider="openai",
                    credits=credits * NANO,
                    request_id=request_id,
                )

            store.commits.replica = "ghost"
            a = await store.reserve(group.id, key.id, 10 * NANO, Hold(MODEL, "openai", "req_a"))
            b = await store.reserve(group.id, key.id, 10 * NANO, Hold(MODEL, "openai", "req_b"))
            assert not isinstance(a, Refusal) and not isinstance(b, Refusal)
            await store.settle(b, record(2, "req_b"))  # committed, though its process journaled it too
            async with store.db.connection() as conn:  # a's replica stopped heartbeating
                assert await release(conn, [a.id], released_by_lease("ghost")) == 1
            entries = [Entry.new(a, record(3, "req_a")), Entry.new(b, record(2, "req_b"))]
            assert await store.replay(entries) == {entries[0].id: True, entries[1].id: False}
            assert await store.replay(entries) == {entries[0].id: False, entries[1].id: False}
            g = await store.get_group("g")
            assert g is not None and (g.balance, g.reserved, g.spent) == (95 * NANO, 0, 5 * NANO)
            assert sorted((r.request_id, r.status, r.credits) for r in await store.usage(group="g")) == [
                ("req_a", "interrupted", 0),
                ("req_a", "ok", 3 * NANO),
                ("req_b", "ok", 2 * NANO),
            ]
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_released_hold_s_record_keeps_its_call_s_endpoint_and_whether_it_streamed(pg: Postgres) -> None:
    """The ``interrupted`` record of a dead replica's hold said endpoint ``chat``, not streamed, whatever
    the call was: the reservation now keeps both (a stream's hold with no checkpoint yet)."""
    from billing.leases import released_by_lease
    from billing.postgres_ledger import release

    url = pg.fresh_url()

    async def scenario() -> None:
        store = open_store(url)
        await store.open()
        try:
            group = await store.create_group("g", 100 * NANO)
            key = await store.create_key("g", "k", "1" * 64, "sk-mr-...1111")
            store.commits.replica = "ghost"
            holds = [
                Hold(MODEL, "openai", "req_m", "messages", True),
                Hold(MODEL, "openai", "req_r", "responses", False),
            ]
            made = [await store.reserve(group.id, key.id, 10 * NANO, hold) for hold in holds]
            assert all(isinstance(r, Reservation) for r in made)
            async with store.db.connection() as conn:
                assert await release(conn, [r.id for r in made], released_by_lease("ghost")) == 2
            records = {r.request_id: r for r in await store.usage(group="g")}
            assert {(r.endpoint, r.stream, r.status, r.credits) for r in records.values()} == {
                ("messages", True, "interrupted", 0),
                ("responses", False, "interrupted", 0),
            }
        finally:
            await store.close()

    asyncio.run(scenario())
