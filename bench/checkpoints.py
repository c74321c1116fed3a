"""What the streams' checkpoints cost (billing/progress.py): one tick with N streams in flight, on SQLite
and on PostgreSQL.

    .venv/bin/python -m bench.checkpoints [--streams 100,1000,10000] [--ticks 5]

Each stream is a real :class:`billing.ledger.Meter` of a real reservation, its source a reader that has
generated one second of a 25-token-a-second answer more at each tick. A tick counts the tokens each
stream added and writes its checkpoint to the store (SQLite: its ``in_progress`` row through the group
commit; PostgreSQL: the reservation rows), the first with how to charge it (its prompt counted).
Reported per tick: the wall time, the event loop's share (the rest is the store: its thread, the
database; and the count of a slice with much to count, on a worker thread), the longest the event
loop was held at once (how late a 1-ms timer fired, over as many ticks again), and per stream.
PostgreSQL: a throwaway database at ``BENCH_POSTGRES``. Results: bench/results/checkpoints.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.stack import _pg_admin, pg_database
from billing.backends import open_store
from billing.ledger import Meter, ledger_for
from billing.store import Hold, Store, UsageRecord
from core.config import Settings, StoreSettings
from core.wire import TokenUsage

RESULTS = Path(__file__).with_name("results")
SECOND = "the router answers every call with care and the credits are billed to the group exactly " * 2
MODEL = Settings().load_catalog().models["openai/gpt-4o-mini"]


class Source:
    """A stream that has generated one more second of text at each tick."""

    def __init__(self) -> None:
        self.text = ""

    def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
        return None, None

    def generated(self) -> str:
        return self.text


async def one(url: str, streams: int, ticks: int) -> dict[str, float]:
    store: Store = open_store(url)
    await store.open()
    await store.serve(StoreSettings(url=url))
    ledger = ledger_for(store, checkpoint=0.001)  # (every stream due again at each tick)
    await ledger.start(None)
    try:
        group = await store.create_group("bench", 10**15)
        key = await store.create_key("bench", "k", os.urandom(32).hex(), "hint")
        sources = []
        for n in range(streams):
            reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, "openai", f"r{n}"))
            record = UsageRecord(
                key_id=key.id,
                group_id=group.id,
                model=MODEL.id,
                provider="openai",
                stream=True,
                request_id=f"r{n}",
            )
            meter = Meter(
                ledger, reservation, MODEL, record, {"messages": [{"role": "user", "content": "hi"}]}
            )
            meter.started -= 2.0  # old enough to be due
            source = Source()
            meter.follow(source)
            sources.append(source)
        walls, loops = [], []
        for _ in range(ticks):
            for source in sources:
                source.text += SECOND
            began, cpu = time.perf_counter(), time.thread_time()
            noted = await ledger.progress.tick()
            walls.append(time.perf_counter() - began)
            loops.append(time.thread_time() - cpu)  # this thread: the event loop's work in the tick
            assert noted == streams
        held = 0.0
        for _ in range(ticks):  # again, with a timer every ms beside it: the longest the loop was held
            for source in sources:
                source.text += SECOND
            stop = asyncio.Event()
            probe = asyncio.ensure_future(_longest_hold(stop))
            await ledger.progress.tick()
            stop.set()
            held = max(held, await probe)
        wall, loop = sorted(walls)[len(walls) // 2], sorted(loops)[len(loops) // 2]
        return {
            "streams": streams,
            "tick_ms": wall * 1000,
            "loop_ms": loop * 1000,
            "per_stream_us": wall / streams * 1e6,
            "held_ms": held * 1000,
        }
    finally:
        await ledger.close()
        await store.close()


async def _longest_hold(stop: asyncio.Event) -> float:
    """The longest a 1-ms timer fired late until ``stop``: the longest the event loop was held."""
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last - 0.001), now
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="100,1000,10000")
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    results: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgres": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            results["sqlite"].append(asyncio.run(one(f"sqlite:///{tmp}/c{n}.db", n, args.ticks)))
    database = f"bench_checkpoints_{os.getpid()}"
    try:
        for n in counts:
            results["postgres"].append(
                asyncio.run(one(pg_database(database), n, args.ticks))
            )  # (a fresh one each)
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    for store, rows in results.items():
        for r in rows:
            print(
                f"  {store:9s} {int(r['streams']):>6,} streams: a tick {r['tick_ms']:8.1f} ms "
                f"(event loop {r['loop_ms']:6.1f} ms, held at most {r['held_ms']:6.1f} ms at once), "
                f"{r['per_stream_us']:6.1f} us per stream"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoints.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
