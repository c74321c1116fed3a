"""The console at scale: every page's server time with a million usage records, on SQLite and on
PostgreSQL.

    .venv/bin/python -m bench.console                      # 1,000,000 records, both stores (~6 minutes)
    .venv/bin/python -m bench.console --rows 200000 --stores sqlite

For each store: a fresh store (a SQLite file in a temp directory; a PostgreSQL database of its own,
dropped after) seeded by :mod:`bench.console_data` (groups and keys through the store, then ``--rows``
usage records over 90 days loaded in bulk, and 40 batches in the jobs store), the rollups caught up
(timed: the first refresh reads every record once) and, on PostgreSQL, ``ANALYZE`` (what autovacuum does
on a live database; a bulk load gives it no time to). Then ``router serve`` on it, a login, and each
page ``--repeat`` times: the figure is the ``Server-Timing`` the console puts on each answer (the time
from the request to its headers), the median and the slowest; for the CSV of one day (streamed), the
time to its last byte as the client reads it on loopback. Results: bench/results/console.json and a
table on stdout; a page over ``--budget`` ms (default 300) is marked.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench.console_data import GROUPS, seed
from bench.procs import free_port
from billing.analysis import Analysis
from billing.backends import open_store
from billing.store import Store
from jobs.backends import open_job_store
from jobs.store import BatchRow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-console-admin-token-" + secrets.token_hex(8)
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class Timing:
    page: str
    path: str
    median_ms: float
    max_ms: float
    status: int


async def prepare(url: str, rows: int) -> dict[str, Any]:
    store = open_store(url)
    await store.open()
    try:
        began = time.perf_counter()
        seeded = await seed(store, rows)
        loaded = time.perf_counter() - began
        await batches(store, seeded.batches, seeded.keys)
        if store.database.dialect != "sqlite":
            await store.database.write("ANALYZE usage")
        began = time.perf_counter()
        await Analysis(store.history).rollup.refresh()
        rolled = time.perf_counter() - began
        if store.database.dialect != "sqlite":
            await store.database.write("ANALYZE")
        sample = await store.history.usage(limit=1)
        return {
            "load_s": round(loaded, 1),
            "first_refresh_s": round(rolled, 1),
            "record": sample[0].id,
            "request_id": sample[0].request_id,
            "batch": seeded.batches[-1],
            "key": next(iter(seeded.keys)),
        }
    finally:
        await store.close()


async def batches(store: Store, ids: list[str], keys: dict[int, int]) -> None:
    """The batches the seeded job records belong to, as the jobs store keeps them."""
    jobs = open_job_store(store, tempfile.mkdtemp(prefix="bench-files-"))
    await jobs.open()
    now = int(time.time())
    key_ids = sorted(keys)
    for n, batch_id in enumerate(ids):
        key = key_ids[n % len(key_ids)]
        done = n < len(ids) - 2
        await jobs.create_batch(
            BatchRow(
                id=batch_id,
                group_id=keys[key],
                key_id=key,
                endpoint="/v1/chat/completions",
                input_file_id=f"file-{n}",
                completion_window="24h",
                status="completed" if done else "in_progress",
                created_at=now - 86400 * (40 - n),
                expires_at=now + 86400,
                total=5000,
                completed=4900 if done else 2000,
                failed=100 if done else 12,
            )
        )


class Browser:
    """Cookies and CSRF, as the browser keeps them (stdlib http.client, keep-alive)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.cookies: dict[str, str] = {}

    def get(
        self, path: str, body: bytes | None = None, method: str = "GET"
    ) -> tuple[int, dict[str, str], bytes, float]:
        headers = {"cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        if body is not None:
            headers["content-type"] = "application/x-www-form-urlencoded"
        began = time.perf_counter()
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        took = (time.perf_counter() - began) * 1000
        found = {k.lower(): v for k, v in response.getheaders()}
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                for morsel in SimpleCookie(value).values():
                    self.cookies[morsel.key] = morsel.value
        return response.status, found, data, took

    def login(self) -> None:
        _, _, page, _ = self.get("/console/login")
        csrf = re.search(rb'name="csrf" value="([^"]+)"', page).group(1).decode()  # type: ignore[union-attr]
        status, _, _, _ = self.get(
            "/console/login", urlencode({"csrf": csrf, "password": TOKEN}).encode(), "POST"
        )
        assert status == 303, f"login answered {status}"


def pages(info: dict[str, Any]) -> dict[str, str]:
    group = GROUPS[0]
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400 * 3))
    return {
        "overview 24h": "/console/?period=24h",
        "overview 7d": "/console/",
        "overview 30d": "/console/?period=30d",
        "overview 90d": "/console/?period=90d",
        "overview all, jobs": "/console/?period=all&source=job",
        "groups": "/console/groups",
        "group 7d": f"/console/groups/{group}",
        "group 90d": f"/console/groups/{group}?period=90d",
        "group keys": f"/console/groups/{group}/keys",
        "calls": f"/console/groups/{group}/calls",
        "calls 90d": f"/console/groups/{group}/calls?period=90d",
        "calls 90d, model prefix": f"/console/groups/{group}/calls?period=90d&model=claude",
        "calls 90d, errors": f"/console/groups/{group}/calls?period=90d&status=error",
        "calls 90d, rejected": f"/console/groups/{group}/calls?period=90d&status=rejected",
        "calls 90d, user": f"/console/groups/{group}/calls?period=90d&user=user-7",
        "calls 7d, streams": f"/console/groups/{group}/calls?stream=yes",
        "calls 7d, jobs, page 2": f"/console/groups/{group}/calls?source=job&page=2&before={info['record']}",
        "calls 90d, oldest page": f"/console/groups/{group}/calls?period=90d&after=0",
        "calls of a batch": f"/console/groups/{group}/calls?period=all&batch={info['batch']}",
        "every group's calls 7d": "/console/calls",
        "every group's errors 24h": "/console/calls?period=24h&status=error",
        "a call": f"/console/calls/{info['record']}",
        "find a request id": f"/console/calls?request={info['request_id']}",
        "keys 7d": "/console/keys",
        "keys 90d": "/console/keys?period=90d",
        "a key 30d": f"/console/keys/{info['key']}?period=30d",
        "batches": "/console/batches",
        "a batch": f"/console/batches/{info['batch']}",
        f"CSV of one day ({day})": f"/console/groups/{group}/calls.csv?from={day}&to={day}",
    }


def measure(port: int, info: dict[str, Any], repeat: int) -> list[Timing]:
    browser = Browser(port)
    browser.login()
    out = []
    for name, path in pages(info).items():
        times: list[float] = []
        status = 0
        for _ in range(repeat):
            status, headers, body, took = browser.get(path)
            server = re.search(r"app;dur=([\d.]+)", headers.get("server-timing", ""))
            streamed = headers.get("content-type", "").startswith("text/csv")
            times.append(took if streamed or server is None else float(server.group(1)))
        out.append(Timing(name, path, round(statistics.median(times), 1), round(max(times), 1), status))
    return out


def serve(url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = workdir / "router.toml"
    config.write_text(
        f'[store]\nurl = "{url}"\n[console]\nadmin_token = "{TOKEN}"\n'
        "[observability]\naccess_log = false\n[jobs]\nrunner = false\n"
    )
    log = open(workdir / "gateway.log", "wb")  # noqa: SIM115 (kept open for the process's life)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the gateway did not start: {(workdir / 'gateway.log').read_text()[-2000:]}")


def run_store(kind: str, rows: int, repeat: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-console-{kind}-"))
    database = f"bench_console_{secrets.token_hex(4)}"
    url = f"sqlite:///{workdir}/router.db"
    if kind == "postgresql":
        asyncio.run(_pg(f"CREATE DATABASE {database}"))
        url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    try:
        print(f"{kind}: loading {rows:,} usage records ...", flush=True)
        info = asyncio.run(prepare(url, rows))
        print(
            f"{kind}: loaded in {info['load_s']} s, rollups caught up in {info['first_refresh_s']} s",
            flush=True,
        )
        proc, port = serve(url, workdir)
        try:
            timings = measure(port, info, repeat)
        finally:
            proc.terminate()
            proc.wait(30)
        return {
            "store": kind,
            "rows": rows,
            **{k: info[k] for k in ("load_s", "first_refresh_s")},
            "pages": [asdict(t) for t in timings],
        }
    finally:
        if kind == "postgresql":
            asyncio.run(_pg(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        shutil.rmtree(workdir, ignore_errors=True)


async def _pg(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="usage records to load")
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--repeat", type=int, default=5, help="requests per page (the median is reported)")
    parser.add_argument("--budget", type=float, default=300.0, help="milliseconds a page may take")
    args = parser.parse_args(argv)
    results = [run_store(kind, args.rows, args.repeat) for kind in args.stores.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "console.json").write_text(json.dumps(results, indent=1))
    names = [p["page"] for p in results[0]["pages"]]
    print(
        f"\nServer time per console page, {args.rows:,} usage records (median / slowest of {args.repeat}, ms)"
    )
    print(f"  {'page':40s}" + "".join(f"{r['store']:>22s}" for r in results))
    over = 0
    for i, name in enumerate(names):
        cells = []
        for r in results:
            p = r["pages"][i]
            late = p["median_ms"] > args.budget
            over += late
            cells.append(f"{p['median_ms']:>8.1f} / {p['max_ms']:>7.1f}{' !' if late else '  '}")
        print(f"  {name:40s}" + "".join(f"{c:>22s}" for c in cells))
    print(
        "  (status of every page: "
        + ", ".join(sorted({str(p["status"]) for r in results for p in r["pages"]}))
        + ")"
    )
    print(f"{'every page under' if not over else f'{over} page(s) over'} {args.budget:.0f} ms")
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main())
