"""A gateway process killed with SIGKILL under load, on each store: no call the caller saw complete goes
uncharged (its settlement was durable before its last byte went out), none is charged twice, and the
ledger balances once the store has reconciled the dead process's calls (docs/operations.md, "Faults").
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from billing.store import UsageRecord
from core.catalog import NANO
from tests.conftest import Stack
from tests.test_faults import _config, _serve, books

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-4o-mini"


def _run(config: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--config", str(config), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _gateway(stack: Stack, url: str, tmp: Path, group: str, initial: int) -> tuple[Path, str]:
    """A config (leases of 1 s: a restarted replica releases the dead one's holds at once; a stream's
    checkpoints 1 s apart) and a key of ``group``, made with ``initial`` credits."""
    config = _config(tmp, url, stack, "gateway", grace=1, checkpoint=1)
    _run(config, "groups", "create", group, "--credits", str(initial // NANO))
    return config, _run(config, "keys", "create", "--group", group).strip().splitlines()[-1]


def _restarted_books(
    config: Path, tmp: Path, url: str, group: str
) -> tuple[int, int, int, list[UsageRecord]]:
    """The group's books once a restarted gateway has reconciled (SQLite at its start; PostgreSQL when
    it releases the dead replica's holds)."""
    proc, _ = _serve(config, tmp, "restarted")
    try:
        deadline = time.monotonic() + 30
        while True:
            books_now = asyncio.run(books(url, group))
            if books_now[1] == 0 or time.monotonic() > deadline:
                return books_now
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)


async def _caller(client: openai.AsyncOpenAI, name: str, seen: list[str], stop: asyncio.Event) -> None:
    """Calls in a loop until one fails (the kill); ``seen``: the request ids of the calls it saw complete:
    a whole answer, or a stream up to its usage chunk (which goes out with ``[DONE]``)."""
    n = 0
    while not stop.is_set():
        rid = f"{name}-{n}"
        n += 1
        headers = {"x-request-id": rid}
        messages = [{"role": "user", "content": f"[tokens:12] call {rid}"}]
        try:
            if n % 3 == 0:
                chunks = await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=40,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=headers,
                )
                ended = False
                async for chunk in chunks:
                    ended = ended or chunk.usage is not None
                if not ended:
                    return
            else:
                await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=40, extra_headers=headers
                )
        except (openai.APIError, OSError):
            return
        seen.append(rid)


def _killed_under_load(stack: Stack, url: str, tmp: Path) -> tuple[list[str], Path, str, int]:
    group, initial = "killed", 1_000 * NANO
    config, key = _gateway(stack, url, tmp, group, initial)
    proc, base = _serve(config, tmp, "first")
    seen: list[str] = []
    try:

        async def load() -> None:
            stop = asyncio.Event()
            async with openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=30) as client:
                callers = [asyncio.ensure_future(_caller(client, f"c{i}", seen, stop)) for i in range(12)]
                await asyncio.sleep(1.5)
                proc.send_signal(signal.SIGKILL)  # calls are completing all the time: some the instant before
                await asyncio.gather(*callers)

        asyncio.run(load())
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return seen, config, group, initial


def test_a_hard_kill_loses_no_charge_the_caller_saw(stack: Stack, store_url: str, tmp_path: Path) -> None:
    seen, config, group, initial = _killed_under_load(stack, store_url, tmp_path)
    assert len(seen) > 100
    balance, reserved, spent, records = _restarted_books(config, tmp_path, store_url, group)
    charged = {r.request_id for r in records if r.status == "ok"}
    lost = [rid for rid in seen if rid not in charged]
    owed = re.search(
        r"settled (\d+) charges a stopped process owed", (tmp_path / "restarted.log").read_text()
    )
    print(
        f"\nkilled under load ({store_url.split(':')[0]}): {len(seen)} calls seen complete, "
        f"{len(records)} records, {len(lost)} seen complete but not charged; "
        f"{owed.group(1) if owed else 0} settled from the owed log at the restart"
    )
    assert not lost, f"{len(lost)} calls the caller saw complete were not charged: {lost[:5]}"
    ok = [r.request_id for r in records if r.status == "ok"]
    assert len(ok) == len(set(ok)), "a call charged twice"
    assert reserved == 0
    assert balance + spent == initial and spent == sum(r.credits for r in records)


def test_streams_cut_by_a_hard_kill_are_charged_up_to_their_last_checkpoint(
    stack: Stack, store_url: str, tmp_path: Path
) -> None:
    """Long streams in flight when the process is killed: each is charged (``interrupted``) for what it had
    generated at its last checkpoint (every second here): no more than the caller received, and
    no less than that minus what one checkpoint interval brings (SQLite at the next start, PostgreSQL
    when the restarted replica releases the dead one's holds)."""
    group, initial = "cut", 1_000 * NANO
    config, key = _gateway(stack, store_url, tmp_path, group, initial)
    proc, base = _serve(config, tmp_path, "first")
    received: dict[str, str] = {}
    try:

        async def stream(client: openai.AsyncOpenAI, rid: str) -> None:
            messages = [{"role": "user", "content": f"[delay:40] [tokens:400] cut {rid}"}]
            received[rid] = ""
            try:
                chunks = await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=500,
                    stream=True,
                    extra_headers={"x-request-id": rid},
                )
                async for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        received[rid] += chunk.choices[0].delta.content
            except (openai.APIError, OSError):
                pass

        async def load() -> float:
            async with openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=30) as client:
                began = time.monotonic()
                streams = [asyncio.ensure_future(stream(client, f"cut-{n}")) for n in range(8)]
                await asyncio.sleep(2.7)
                proc.send_signal(signal.SIGKILL)
                elapsed = time.monotonic() - began
                await asyncio.gather(*streams)
                return elapsed

        elapsed = asyncio.run(load())
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    balance, reserved, spent, records = _restarted_books(config, tmp_path, store_url, group)
    from billing import tokens

    cut = {r.request_id: r for r in records if r.status == "interrupted"}
    assert sorted(cut) == sorted(received), (sorted(cut), sorted(received))
    for rid, text in received.items():
        got = tokens.count(text)  # what the caller received (the gateway counts the same way)
        per_second = got / elapsed
        record = cut[rid]
        print(
            f"\n{rid}: received {got} tokens, charged for {record.completion_tokens} ({record.credits} nano)"
        )
        assert got > 2 * per_second * 0.5  # (it streamed for a while)
        assert got - per_second * 1.5 <= record.completion_tokens <= got + 1, (got, record)
        assert record.credits > 0 and record.prompt_tokens > 0 and not record.usage_exact
    assert reserved == 0
    assert balance + spent == initial and spent == sum(r.credits for r in records)


def test_the_owed_log_settles_what_a_crash_left_once(tmp_path: Path) -> None:
    """SQLite's owed log (billing/owed.py), at the store: the lines of settlements whose replies went out
    but whose group commit never ran are settled at the next start, once; a line whose commit ran (the
    file not yet emptied) is not settled again; a clean run leaves the file holding its epoch only."""
    from billing.owed import entry_id
    from billing.sqlite import Settle, SQLiteStore
    from billing.store import Reservation, UsageRecord
    from core.config import StoreSettings

    url = f"sqlite:///{tmp_path}/owed.db"
    owed = tmp_path / "owed.db.owed"

    async def started() -> SQLiteStore:
        store = SQLiteStore(url)
        await store.open()
        await store.serve(StoreSettings(url=url))
        return store

    def crash(store: SQLiteStore) -> None:  # what SIGKILL leaves: the files as they are, nothing flushed
        assert store.owed is not None and store._owner is not None
        store.owed.close()
        store._owner.close()

    async def main() -> None:
        store = await started()
        await store.recover_stopped()
        group = await store.create_group("g", 10_000)
        key = await store.create_key("g", "k", "h" * 64, "hint")

        def charge(rid: int, credits: int, name: str) -> tuple[Reservation, UsageRecord]:
            record = UsageRecord(
                key_id=key.id, group_id=group.id, model="m", provider="p", credits=credits, request_id=name
            )
            return Reservation(rid, group.id, key.id, credits), record

        assert await store.settle_soon(*charge(-1, 100, "a"), owed=True) == 100
        assert owed.read_bytes() == store.owed_epoch.encode() + b"\n"  # committed: the file starts over
        assert store.owed is not None
        store.owed.write(*charge(-2, 200, "b"))  # replies gone, commits never ran
        store.owed.write(*charge(-3, 300, "c"))
        seq = store.owed.write(*charge(-4, 400, "d"))  # committed, but the file not emptied yet
        assert (
            await store.commits.submit(Settle(*charge(-4, 400, "d"), 0.0, epoch=store.owed_epoch, owed=seq))
            == 400
        )
        first_epoch = store.owed_epoch
        crash(store)
        await store.thread.close()

        store = await started()
        assert await store.recover_stopped() == 2  # b and c
        assert store.owed_epoch != first_epoch and owed.read_bytes() == store.owed_epoch.encode() + b"\n"
        records = await store.usage(group="g", limit=100)
        assert sorted(r.request_id or "" for r in records) == ["a", "b", "c", "d"]
        g = await store.get_group("g")
        assert g is not None and g.spent == 1_000
        await store.close()

        store = await started()  # a clean stop before: nothing to settle again
        assert await store.recover_stopped() == 0
        assert len(await store.usage(group="g", limit=100)) == 4
        await store.close()
        assert entry_id(first_epoch, 2) == f"owed:{first_epoch}:2"

    asyncio.run(main())
