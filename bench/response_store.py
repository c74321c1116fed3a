"""The stored responses' growth: bytes per 1,000 stored responses, on SQLite and on PostgreSQL.

    .venv/bin/python -m bench.response_store [--count 1000]

Stores ``--count`` responses like the one a call of ``python -m bench.instructions`` makes (the
Response object of a 12-token answer, one input message, one output message, their ids indexed)
through :class:`gateway.response_store.ResponseStore`, and reports how much the database grew: the
SQLite file's pages in use (after a WAL checkpoint) and PostgreSQL's ``pg_total_relation_size`` of the
two tables (rows, indexes, TOAST). PostgreSQL: a throwaway database at ``BENCH_POSTGRES``.
Results: bench/results/response_store.json.
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

from bench.stack import PG_ADMIN, _pg_admin
from billing.backends import open_store
from billing.store import Database
from gateway.conversation import own_items
from gateway.response_store import Encoded, ResponseStore, Stored
from gateway.responses_translate import from_completion, shell

RESULTS = Path(__file__).with_name("results")
PROMPT = "Reply with exactly 12 tokens of lorem ipsum, nothing else."
ANSWER = "the router answers every call with care and the credits are billed"


def response(n: int) -> Stored:
    body = {"model": "openai/gpt-4o-mini", "input": PROMPT}
    completion = {
        "choices": [{"message": {"content": ANSWER}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 12, "total_tokens": 31},
    }
    out = from_completion(completion, shell(body, "openai/gpt-4o-mini"))
    return Stored(
        out["id"], 1, 1, out["status"], out["model"], time.time(), None, out, own_items(PROMPT), out["output"]
    )


async def size(db: Database) -> int:
    if db.dialect == "sqlite":
        await db.write("PRAGMA wal_checkpoint(TRUNCATE)")
        [(pages,)] = await db.select("PRAGMA page_count")
        [(free,)] = await db.select("PRAGMA freelist_count")
        [(page,)] = await db.select("PRAGMA page_size")
        return int((pages - free) * page)
    [(total,)] = await db.select(
        "SELECT pg_total_relation_size('responses') + pg_total_relation_size('response_items')"
    )
    return int(total)


async def growth(url: str, count: int) -> int:
    store = open_store(url)
    await store.open()
    try:
        responses = ResponseStore(store.database)
        await responses.ready()
        before = await size(store.database)
        expires = time.time() + 30 * 86400
        for n in range(count):
            stored = response(n)
            await responses.insert(stored, Encoded(stored), expires)
        return await size(store.database) - before
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args(argv)
    sample = Encoded(response(0))
    figures = {"row_json_bytes": sample.size}
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as tmp:
        figures["sqlite"] = asyncio.run(growth(f"sqlite:///{tmp}/router.db", args.count))
    name = f"router_responses_{os.getpid()}"
    _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    try:
        figures["postgresql"] = asyncio.run(growth(f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}", args.count))
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    per = 1000 / args.count
    print(f"one stored response: {sample.size} bytes of JSON (Response object, input and output items)")
    for kind in ("sqlite", "postgresql"):
        print(
            f"{kind:10s} +{figures[kind] * per / 1024:8.0f} KiB per 1,000 stored responses "
            f"({figures[kind] / args.count:.0f} bytes each)"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "response_store.json").write_text(
        json.dumps({"count": args.count, **figures}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
