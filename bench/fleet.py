"""The fleet on paper, from measurements (docs/scale.md): what one PostgreSQL primary sustains in
settlements per second for 1, 2, 4 and 8 gateway replicas, what Redis sustains for the rate limits and
the deployments' shared state, and a sharded ledger simulated on this machine's PostgreSQL.

    .venv/bin/python -m bench.fleet [--seconds 5] [--replicas 1,2,4,8] [--shards 2] [--redis URL] [--postgres URL]

- **replicas**: N worker processes, each one gateway replica's ledger (billing/postgres_ledger.py: group
  commit, the batch function) on one database, ``--tasks`` callers each, every replica on groups of its
  own (tenants spread over the fleet). They start together and run ``--seconds``; the figure is the
  settlements committed in that window by all of them.
- **redis**: N worker processes each doing what one call asks of Redis with the shared path on: the rate
  limits' script (``gateway/ratelimit_redis.py``: a key's and a group's requests and tokens per minute,
  four buckets) and the deployments' acquire and release (``gateway/upstream_state_redis.py``: two
  deployments). The figure is calls per second, three scripts each.
- **shards**: the same replicas with groups placed on ``--shards`` databases of this server by a hash of
  the group's name (each a PostgreSQL primary of its own in production): every replica holds a store per
  shard and settles each group on its shard.

After every run the ledger is checked on every database: nothing left reserved, each group's balance +
spent equal to its credits, one usage record per settlement and their credits adding up to what was
spent. On this 2-CPU machine the replicas, the database server and Redis share two CPUs: the figures
say where the CPU goes, and docs/scale.md reads them as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import zlib
from typing import Any

import asyncpg

from bench.ledger import CREDITS, POSTGRES, WORST, run_loop
from billing.backends import open_store
from billing.ledger import ledger_for
from billing.store import Store, UsageRecord

REDIS = "redis://127.0.0.1:6379/0"
GROUPS_PER_REPLICA = 4


def shard_of(group: str, shards: int) -> int:
    """The shard a group lives on: a stable hash of its name (every replica computes the same)."""
    return zlib.crc32(group.encode()) % shards


# -- the workers (one process each) -------------------------------------------------------------------
async def ledger_worker(
    urls: list[str], replica: int, tasks: int, start: float, seconds: float
) -> dict[str, Any]:
    stores: list[Store] = [open_store(url) for url in urls]
    for store in stores:
        await store.open()
    try:
        names = [f"fleet-{replica}-{i}" for i in range(GROUPS_PER_REPLICA)]
        placed = []
        for name in names:
            store = stores[shard_of(name, len(stores))]
            group = await store.create_group(name, CREDITS)
            key = await store.create_key(name, "bench", secrets.token_hex(16), "bench")
            placed.append((ledger_for(store), group.id, key.id, name))
        await asyncio.sleep(max(0.0, start - time.time()))
        deadline = time.perf_counter() + seconds
        settled: dict[str, int] = dict.fromkeys(names, 0)

        async def caller(n: int) -> None:
            ledger, group_id, key_id, name = placed[n % len(placed)]
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
                    credits=700 + done % 5 * 500,
                    latency_ms=1.0,
                    request_id=f"fleet-{replica}-{n}-{done}",
                )
                await ledger.settle_soon(reservation, record)
                done += 1
            settled[name] += done

        began = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(tasks)))
        return {"settled": settled, "seconds": time.perf_counter() - began}
    finally:
        for store in stores:
            await store.close()


async def redis_worker(url: str, replica: int, tasks: int, start: float, seconds: float) -> dict[str, Any]:
    from core.deployments import Deployment
    from gateway.ratelimit import Bucket
    from gateway.ratelimit_redis import RedisBackend
    from gateway.upstream_state_redis import RedisState

    limits = RedisBackend(url, prefix=f"bench-fleet:{os.getpid()}:rl")
    state = RedisState(url, prefix=f"bench-fleet:{os.getpid()}:dep")
    deps = [
        Deployment("openai", f"http://127.0.0.1:9/{n}", "k", name=n, rpm=10**7, tpm=10**9) for n in ("a", "b")
    ]
    try:
        await asyncio.sleep(max(0.0, start - time.time()))
        deadline = time.perf_counter() + seconds
        calls = [0]

        async def caller(n: int) -> None:
            key, group = f"key:{replica}-{n % 16}", f"group:{replica}-{n % 4}"
            buckets = [
                Bucket(f"{key}:rpm", 10**9, 1),
                Bucket(f"{key}:tpm", 10**12, 500),
                Bucket(f"{group}:rpm", 10**9, 1),
                Bucket(f"{group}:tpm", 10**12, 500),
            ]
            while time.perf_counter() < deadline:
                await limits.take(buckets)
                lease = await state.acquire(deps, "gpt-4o-mini", 500)
                if not isinstance(lease, float):
                    lease.latency = 0.001
                    lease.end()
                calls[0] += 1

        began = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(tasks)))
        await asyncio.sleep(0.05)  # the last releases (fire and forget) reach Redis
        return {"calls": calls[0], "seconds": time.perf_counter() - began}
    finally:
        await limits.close()
        await state.close()


def worker_main(spec: dict[str, Any]) -> None:
    if spec["kind"] == "redis":
        work = redis_worker(spec["redis"], spec["replica"], spec["tasks"], spec["start"], spec["seconds"])
    else:
        work = ledger_worker(spec["urls"], spec["replica"], spec["tasks"], spec["start"], spec["seconds"])
    result, _ = run_loop(work)
    print(json.dumps(result))


# -- the parent: processes, databases, checks --------------------------------------------------------
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(names: tuple[str, ...]) -> float:
    """CPU seconds used so far by the processes whose command is one of ``names`` (the database server
    with its backends, or Redis), and by their children that have ended: /proc/<pid>/stat."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm in names:
            total += sum(int(x) for x in rest[11:15]) / TICK  # utime stime cutime cstime
    return total


def spawn(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.fleet", "--worker", json.dumps(s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for s in specs
    ]
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"a worker failed (exit {proc.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


async def make_databases(admin_url: str, count: int) -> list[str]:
    admin = await asyncpg.connect(admin_url, timeout=10)
    try:
        names = [f"bench_fleet_{secrets.token_hex(4)}" for _ in range(count)]
        for name in names:
            await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    base = admin_url.rsplit("/", 1)[0]
    return [f"{base}/{name}" for name in names]


async def drop_databases(admin_url: str, urls: list[str]) -> None:
    admin = await asyncpg.connect(admin_url, timeout=10)
    try:
        for url in urls:
            await admin.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
    finally:
        await admin.close()


async def migrate(urls: list[str]) -> None:
    for url in urls:  # once, before the replicas start (they would take turns on the migration lock)
        store = open_store(url)
        await store.open()
        await store.close()


async def wal_lsn(admin_url: str) -> str:
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        return str(await conn.fetchval("SELECT pg_current_wal_lsn()::text"))
    finally:
        await conn.close()


async def wal_since(admin_url: str, lsn: str) -> int:
    """Bytes of write-ahead log the server wrote since ``lsn`` (every database of it: the runs' own)."""
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", lsn))
    finally:
        await conn.close()


async def check(urls: list[str], settled: dict[str, int]) -> list[str]:
    """What is wrong with the ledgers (nothing: []): every group on its shard, exact to the nano-credit."""
    problems: list[str] = []
    for url in urls:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT g.name, g.balance, g.reserved, g.spent, count(u.id), coalesce(sum(u.credits), 0) "
                "FROM groups g LEFT JOIN usage u ON u.group_id = g.id GROUP BY g.id"
            )
        finally:
            await conn.close()
        for name, balance, reserved, spent, calls, charged in rows:
            if reserved or balance + spent != CREDITS or calls != settled.get(name) or charged != spent:
                problems.append(
                    f"{name}: balance {balance} reserved {reserved} spent {spent} records {calls} "
                    f"(settled {settled.get(name)}) charged {charged}"
                )
    return problems


def ledger_run(admin_url: str, replicas: int, shards: int, tasks: int, seconds: float) -> dict[str, Any]:
    urls = asyncio.run(make_databases(admin_url, shards))
    try:
        asyncio.run(migrate(urls))
        start = time.time() + 3.0 + 0.3 * replicas  # every worker opened and made its groups by then
        before, wal = cpu_of(("postgres",)), asyncio.run(wal_lsn(admin_url))
        results = spawn(
            [
                {
                    "kind": "ledger",
                    "urls": urls,
                    "replica": r,
                    "tasks": tasks,
                    "start": start,
                    "seconds": seconds,
                }
                for r in range(replicas)
            ]
        )
        database_cpu = cpu_of(("postgres",)) - before  # (its backends end with the workers: counted)
        wal_bytes = asyncio.run(wal_since(admin_url, wal))
        settled = {name: n for r in results for name, n in r["settled"].items()}
        problems = asyncio.run(check(urls, settled))
        total = sum(settled.values())
        window = max(r["seconds"] for r in results)
        return {
            "replicas": replicas,
            "shards": shards,
            "tasks_per_replica": tasks,
            "settled": total,
            "per_second": round(total / window, 1),
            "consistent": not problems,
            "problems": problems[:5],
            "database_cpu_ms_per_1000": round(1000 * 1000 * database_cpu / max(total, 1), 1),
            "wal_bytes_per_settlement": round(wal_bytes / max(total, 1)),
        }
    finally:
        asyncio.run(drop_databases(admin_url, urls))


def redis_run(url: str, replicas: int, tasks: int, seconds: float) -> dict[str, Any]:
    start = time.time() + 2.0
    before = cpu_of(("redis-server",))
    results = spawn(
        [
            {"kind": "redis", "redis": url, "replica": r, "tasks": tasks, "start": start, "seconds": seconds}
            for r in range(replicas)
        ]
    )
    redis_cpu = cpu_of(("redis-server",)) - before  # (from before the workers start: their setup counts too)
    calls = sum(r["calls"] for r in results)
    window = max(r["seconds"] for r in results)
    return {
        "replicas": replicas,
        "tasks_per_replica": tasks,
        "calls": calls,
        "per_second": round(calls / window, 1),
        "scripts_per_second": round(3 * calls / window, 1),
        "redis_cpu_us_per_call": round(1e6 * redis_cpu / max(calls, 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--replicas", default="1,2,4,8", help="replica counts to measure (comma-separated)")
    p.add_argument("--tasks", type=int, default=32, help="concurrent callers per replica")
    p.add_argument("--shards", type=int, default=2, help="databases of the sharded run (0: none)")
    p.add_argument("--postgres", default=POSTGRES)
    p.add_argument("--redis", default=REDIS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return 0
    counts = [int(n) for n in args.replicas.split(",") if n.strip()]
    out: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPUs",
        "seconds": args.seconds,
        "replicas": [],
        "redis": [],
        "sharded": [],
    }
    for n in counts:
        r = ledger_run(args.postgres, n, 1, args.tasks, args.seconds)
        out["replicas"].append(r)
        print(
            f"postgres, 1 primary,  {n} replica(s): {r['per_second']:>9,.0f} settlements/s, "
            f"{r['database_cpu_ms_per_1000']} ms of database CPU per 1,000, {r['wal_bytes_per_settlement']:,} B of WAL each "
            f"({'consistent' if r['consistent'] else 'INCONSISTENT ' + '; '.join(r['problems'])})",
            flush=True,
        )
    if args.shards > 1:
        for n in counts:
            r = ledger_run(args.postgres, n, args.shards, args.tasks, args.seconds)
            out["sharded"].append(r)
            print(
                f"postgres, {args.shards} shards,   {n} replica(s): {r['per_second']:>9,.0f} settlements/s, "
                f"{r['database_cpu_ms_per_1000']} ms of database CPU per 1,000, {r['wal_bytes_per_settlement']:,} B of WAL each "
                f"({'consistent' if r['consistent'] else 'INCONSISTENT ' + '; '.join(r['problems'])})",
                flush=True,
            )
    for n in counts:
        r = redis_run(args.redis, n, args.tasks, args.seconds)
        out["redis"].append(r)
        print(
            f"redis, {n} replica(s): {r['per_second']:>9,.0f} calls/s ({r['scripts_per_second']:,.0f} scripts/s), "
            f"{r['redis_cpu_us_per_call']} us of Redis CPU per call",
            flush=True,
        )
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/fleet.json", "w") as f:
        json.dump(out, f, indent=1)
    ok = all(r["consistent"] for r in out["replicas"] + out["sharded"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
