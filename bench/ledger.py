"""Ledger settlement benchmark: how many reserve → settle pairs (each with its usage record) a store
commits per second, for the SQLite store (temporary directory) and the PostgreSQL store (temporary
database), with ``--tasks`` concurrent callers on one group for ``--seconds`` each.

    .venv/bin/python -m bench.ledger [--seconds 5] [--tasks 64] [--postgres postgresql://...]

Afterwards it checks the ledger: reserved back to 0, balance + spent == the initial credits, and one
usage record per settlement whose credits add up to what was spent. ``run(seconds)`` returns the
figures as a dict (for the main bench); it runs its own event loop (uvloop when installed, as the
gateway does).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg

from billing.backends import open_store
from billing.ledger import Ledger, ledger_for
from billing.store import Store, UsageRecord

T = TypeVar("T")

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGETS = {"sqlite": 5_000.0, "postgres": 3_000.0}  # settlements per second
CREDITS = 10**18  # nano-credits: enough never to refuse
WORST = 2_000  # reserved per call
COSTS = (0, 700, 1_500, 2_000, 2_600)  # charged: nothing, less, all, and more than reserved (capped)


async def caller(ledger: Ledger, group_id: int, key_id: int, deadline: float, n: int) -> int:
    """Reserve and settle through the ledger the gateway uses for the store (SQLite: holds in memory,
    the settlement in the group commit; PostgreSQL: both in the store's batches), waiting for each."""
    done = 0
    while time.perf_counter() < deadline:
        reservation = await ledger.reserve(group_id, key_id, WORST)
        record = UsageRecord(
            key_id=key_id,
            group_id=group_id,
            model="bench/model",
            provider="bench",
            prompt_tokens=12,
            completion_tokens=34,
            credits=COSTS[(n + done) % len(COSTS)],
            latency_ms=1.0,
            request_id=f"req-{n}-{done}",
        )
        await ledger.settle_soon(reservation, record)
        done += 1
    return done


async def measure(store: Store, seconds: float, tasks: int) -> dict[str, Any]:
    group = await store.create_group("bench", CREDITS)
    key = await store.create_key("bench", "bench", secrets.token_hex(16), "bench")
    batches = getattr(getattr(store, "commits", None), "batches", 0)
    started = time.perf_counter()
    deadline = started + seconds
    ledger = ledger_for(store)
    counts = await asyncio.gather(*(caller(ledger, group.id, key.id, deadline, n) for n in range(tasks)))
    elapsed = time.perf_counter() - started
    batches = getattr(getattr(store, "commits", None), "batches", 0) - batches
    settled = sum(counts)
    return {
        "settled": settled,
        "seconds": round(elapsed, 3),
        "per_second": round(settled / elapsed, 1),
        "batches": batches,
        "ops_per_batch": round(2 * settled / batches, 1) if batches else None,
        **await check(store, key.id, settled),
    }


async def check(store: Store, key_id: int, settled: int) -> dict[str, Any]:
    group = await store.get_group("bench")
    assert group is not None
    usage = await store.usage_by_model(key_id)
    calls = sum(u.calls for u in usage)
    charged = sum(u.credits for u in usage)
    problems = []
    if group.reserved != 0:
        problems.append(f"reserved is {group.reserved}, not 0")
    total = group.balance + group.spent + group.reserved
    if total != CREDITS:
        problems.append(f"balance + spent + reserved = {total} != {CREDITS}")
    if calls != settled:
        problems.append(f"{calls} usage records for {settled} settlements")
    if charged != group.spent:
        problems.append(f"usage records charge {charged}, the group spent {group.spent}")
    return {"consistent": not problems, "problems": problems, "spent": group.spent}


async def bench_url(url: str, seconds: float, tasks: int) -> dict[str, Any]:
    store = open_store(url)
    await store.open()
    try:
        return await measure(store, seconds, tasks)
    finally:
        await store.close()


async def bench_sqlite(seconds: float, tasks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        return await bench_url(f"sqlite:///{tmp}/ledger.db", seconds, tasks)


async def bench_postgres(admin_url: str, seconds: float, tasks: int) -> dict[str, Any]:
    """In a temporary database on the server of ``admin_url``, dropped afterwards."""
    name = f"bench_ledger_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url, timeout=10)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        try:
            base = admin_url.rsplit("/", 1)[0]
            return await bench_url(f"{base}/{name}", seconds, tasks)
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def guarded(name: str, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        result = await work
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "meets_target": False, "target": TARGETS[name]}
    result["target"] = TARGETS[name]
    result["meets_target"] = result["per_second"] >= TARGETS[name]
    return result


async def run_all(seconds: float, tasks: int, postgres: str) -> dict[str, Any]:
    return {
        "tasks": tasks,
        "sqlite": await guarded("sqlite", bench_sqlite(seconds, tasks)),
        "postgres": await guarded("postgres", bench_postgres(postgres, seconds, tasks)),
    }


def run_loop(main: Awaitable[T]) -> tuple[T, str]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main), "asyncio"  # type: ignore[arg-type]
    return uvloop.run(main), "uvloop"  # type: ignore[arg-type]


def run(seconds: float = 5.0, tasks: int = 64, postgres: str = POSTGRES) -> dict[str, Any]:
    """Both stores, ``seconds`` each; call it outside any running event loop."""
    result, loop = run_loop(run_all(seconds, tasks, postgres))
    result["loop"] = loop
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"ledger settlement benchmark: {result['tasks']} concurrent callers, reserve -> settle, "
        f"{result['loop']}"
    ]
    for name in ("sqlite", "postgres"):
        r = result[name]
        if "error" in r:
            lines.append(f"  {name:<9} ERROR {r['error']}")
            continue
        verdict = "meets" if r["meets_target"] else "BELOW"
        ledger = "ledger consistent" if r["consistent"] else "INCONSISTENT: " + "; ".join(r["problems"])
        lines.append(
            f"  {name:<9} {r['per_second']:>9,.0f} settlements/s ({r['settled']} in {r['seconds']} s, "
            f"{r['ops_per_batch']} ops per commit) target {r['target']:,.0f}: {verdict}; {ledger}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="measuring time per store")
    p.add_argument("--tasks", type=int, default=64, help="concurrent callers")
    p.add_argument("--postgres", default=POSTGRES, help="server (and database to connect to) for the temp db")
    args = p.parse_args(argv)
    result = run(args.seconds, args.tasks, args.postgres)
    print(report(result))
    ok = all(result[n].get("consistent") for n in ("sqlite", "postgres"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
