"""A daily budget under load across replicas: two real gateway processes on one PostgreSQL schema, 200
concurrent calls against a key whose day is worth about 50 calls. The day's spend never exceeds the
budget, every refusal is a 402 ``budget_exceeded`` naming the window and its reset, and once the clock
(``$ROUTER_CLOCK_FILE``, read by both processes) is past midnight the key is admitted again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from billing import budgets
from billing.backends import open_store
from core.clock import ENV
from core.money import to_credits
from tests.conftest import Postgres, Stack, free_port, run_sync, wait_healthy
from tests.test_crash import _config_with_key

BODY = {
    "model": "openai/gpt-4o-mini",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "hi [tokens:8]"}],
}


def _serve(config: Path, port: int, clock_file: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, ENV: str(clock_file)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wait_healthy(port, proc, log)
    return proc


async def _calls(ports: list[int], key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(
        timeout=60, limits=limits, headers={"authorization": f"Bearer {key}"}
    ) as client:
        return await asyncio.gather(
            *(
                client.post(f"http://127.0.0.1:{ports[i % len(ports)]}/v1/chat/completions", json=BODY)
                for i in range(n)
            )
        )


async def _spent(url: str, clock: float) -> tuple[int, int, int]:
    """(the budget's spend in its window, the key's spend, the records' credits) as stored."""
    store = open_store(url)
    store.clock = lambda: clock
    await store.open()
    try:
        (state,) = await budgets.states(store)
        key = (await store.list_keys())[0]
        records = await store.usage(limit=1000)
        return state.spent, key.spent, sum(r.credits for r in records)
    finally:
        await store.close()


def test_two_replicas_never_exceed_a_daily_budget(stack: Stack, pg: Postgres, tmp_path: Path) -> None:
    url = pg.fresh_url()
    config, key = _config_with_key(tmp_path, url, stack.emulators["openai"], "team", 100)
    clock_file = tmp_path / "clock"
    clock_file.write_text("0")
    probe = _one_call_cost(stack)
    budget = probe * 50  # about 50 calls' worth (each holds its worst case until it settles)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "--config",
            str(config),
            "budgets",
            "add",
            "--group",
            "team",
            "--key",
            "1",
            "--amount",
            to_credits(budget),
            "--window",
            "day",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    ports = [free_port(), free_port()]
    procs = [_serve(config, port, clock_file, tmp_path / f"gw{n}.log") for n, port in enumerate(ports)]
    try:
        answers = asyncio.run(_calls(ports, key, 200))
        statuses = Counter(a.status_code for a in answers)
        assert set(statuses) == {200, 402}, statuses
        refusals = [a for a in answers if a.status_code == 402]
        for refusal in refusals:
            error = refusal.json()["error"]
            assert (
                error["code"] == "budget_exceeded" and "per calendar day (UTC) for key 1" in error["message"]
            )
            assert refusal.headers["x-budget-reset"] in error["message"]
            assert refusal.headers["x-budget-window"].startswith(
                to_credits(budget) + " credits per calendar day"
            )
        time.sleep(0.5)  # the last settlements are queued after the answers
        now = time.time()
        window, key_spent, charged = run_sync(_spent(url, now))
        assert window == key_spent == charged <= budget
        assert statuses[200] >= 10 and window > budget // 4
        reset = refusals[0].headers["x-budget-reset"]
        assert reset == budgets.iso(budgets.parse_period("day").resets_at(now, []))

        clock_file.write_text(str(budgets.parse_period("day").resets_at(now, []) - now + 1))  # past midnight
        again = asyncio.run(_calls(ports, key, 4))
        assert [a.status_code for a in again] == [200] * 4, [a.text for a in again]
        print(
            f"\n200 calls over two replicas: {statuses[200]} admitted, {statuses[402]} refused (budget_exceeded); "
            f"spent {to_credits(window)} of {to_credits(budget)} credits in the day; after midnight 4/4 admitted"
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)


def _one_call_cost(stack: Stack) -> int:
    """What one such call costs (the usage record's credits), made on the in-process stack."""
    group = stack.group(5)
    answer = httpx.post(
        f"{stack.base_url}/chat/completions",
        json=BODY,
        timeout=30,
        headers={"authorization": f"Bearer {stack.key(group=group)}"},
    )
    assert answer.status_code == 200, answer.text
    (record,) = stack.run(stack.store.usage(group=group, limit=5))
    assert record.credits > 0
    return record.credits
