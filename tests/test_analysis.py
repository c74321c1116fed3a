"""The console's aggregates (billing/analysis.py) on both stores: the totals from the hourly rollup plus
the records above its watermark and at the period's partial ends equal the totals of the records
themselves, whatever the watermark; two refreshes at once count nothing twice; percentiles are exact
up to EXACT calls and close to exact from a sample above."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from bench.usage_rows import load, rows_of
from billing import analysis
from billing.analysis import Analysis, Totals, percentile
from billing.backends import open_store
from billing.store import Store, UsageRecord
from billing.usage_filter import Filter

T0 = 1_790_000_000.0  # a whole hour
MODELS = ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "mistral/mistral-small-latest"]
STATUSES = ["ok"] * 8 + ["error", "rejected", "interrupted"]


def records(n: int, hours: float, seed: int = 7) -> list[UsageRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        key = rnd.randint(1, 6)
        model = MODELS[rnd.randrange(3)]
        status = rnd.choice(STATUSES)
        out.append(
            UsageRecord(
                key_id=key,
                group_id=1 + key % 2,
                model=model,
                provider=model.split("/")[0],
                endpoint=rnd.choice(["chat", "responses"]),
                source=rnd.choice(["api", "job"]),
                stream=rnd.random() < 0.5,
                prompt_tokens=rnd.randint(1, 900),
                completion_tokens=rnd.randint(0, 300),
                credits=0 if status == "rejected" else rnd.randint(1, 10**7),
                status=status,
                latency_ms=rnd.lognormvariate(5, 0.7),
                ttft_ms=rnd.uniform(5, 90) if status == "ok" else None,
                ts=T0 + 1234.5 + i * hours * 3600 / n,
            )
        )
    return out


def expected(recs: list[UsageRecord], f: Filter, by: tuple[str, ...]) -> dict[tuple[Any, ...], Totals]:
    out: dict[tuple[Any, ...], Totals] = defaultdict(Totals)
    for r in recs:
        if f.group_id is not None and r.group_id != f.group_id:
            continue
        if any(
            getattr(f, name) is not None and getattr(r, name) != getattr(f, name)
            for name in ("key_id", "model", "source", "provider", "endpoint", "status", "stream")
        ):
            continue
        if (f.models is not None and r.model not in f.models) or (f.since is not None and r.ts < f.since):
            continue
        if f.until is not None and r.ts >= f.until:
            continue
        key = tuple(int(r.ts // 3600 * 3600) if name == "hour" else getattr(r, name) for name in by)
        out[key].add(
            (
                1,
                r.status in ("error", "interrupted"),
                r.status == "rejected",
                r.credits,
                r.prompt_tokens,
                r.completion_tokens,
                r.cached_tokens,
                r.reasoning_tokens,
            )
        )
    return dict(out)


@asynccontextmanager
async def loaded(store_url: str, recs: list[UsageRecord]) -> AsyncIterator[tuple[Store, Analysis]]:
    """A store holding ``recs``, and the aggregates over it."""
    store = open_store(store_url)
    await store.open()
    try:
        await load(store, rows_of(recs))
        yield store, Analysis(store.history)
    finally:
        await store.close()


QUESTIONS: list[tuple[Filter, tuple[str, ...]]] = [
    (Filter(), ()),
    (Filter(), ("hour",)),
    (Filter(since=T0 + 3600 * 2.5, until=T0 + 3600 * 7.25), ("group_id", "model")),
    (Filter(1, since=T0 + 3600 * 3), ("hour", "source")),
    (Filter(2, key_id=2, until=T0 + 3600 * 5), ("model", "endpoint")),
    (Filter(1, models=("openai/gpt-4o-mini", "mistral/mistral-small-latest")), ("key_id",)),
    (Filter(provider="anthropic", since=T0 + 600, until=T0 + 900), ()),  # less than an hour
    (Filter(1, status="error", since=T0 + 3600), ("model",)),  # not in the rollup: the records
    (Filter(2, stream=True), ("hour",)),
]


def test_totals_equal_the_records_whatever_the_watermark(store_url: str) -> None:
    recs = records(3000, 10)

    async def go() -> None:
        async with loaded(store_url, recs) as (store, a):
            a.rollup._refreshed = float("inf")  # no refresh by readers: the watermarks below are the test's

            async def check() -> None:
                for f, by in QUESTIONS:
                    assert await a.totals(f, by) == expected(recs, f, by), (f, by)

            await check()  # nothing rolled up: all from the records
            half = await a.rollup.refresh(now=T0 + 3600 * 5)  # the first hours rolled up
            assert 0 < half < len(recs)
            await check()
            done = await a.rollup.refresh(now=T0 + 3600 * 100)
            assert done == len(recs) and await a.rollup.refresh(now=T0 + 3600 * 100) == done
            await check()
            rolled = await store.database.select("SELECT sum(calls) FROM usage_hourly")
            assert int(rolled[0][0]) == len(recs)  # each record counted once

    asyncio.run(go())


def test_a_reader_rolls_up_a_little_and_leaves_the_rest_to_a_task(tmp_path: Any) -> None:
    recs = records(3000, 10, seed=5)

    async def go() -> None:
        async with loaded(f"sqlite:///{tmp_path}/r.db", recs) as (_, a):
            assert await a.rollup.fresh(max_ids=500) == 500  # the reader's share
            task = a.rollup._task
            assert task is not None
            assert await task == len(recs) == await a.rollup.rolled()  # the rest, meanwhile
            assert await a.totals(Filter(), ("hour",)) == expected(recs, Filter(), ("hour",))

    asyncio.run(go())


def test_concurrent_refreshes_count_each_record_once(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("billing.rollup.CHUNK", 97)
    recs = records(2000, 6, seed=3)

    async def go() -> None:
        store = open_store(store_url)
        await store.open()
        other = open_store(store_url)  # a second process's handle on the same store
        await other.open()
        try:
            await load(store, rows_of(recs))
            mine, theirs = Analysis(store.history), Analysis(other.history)
            await asyncio.gather(*(a.rollup.refresh(now=T0 + 3600 * 100) for a in (mine, theirs, mine)))
            rows = await store.database.select("SELECT sum(calls), sum(credits) FROM usage_hourly")
            assert (int(rows[0][0]), int(rows[0][1])) == (len(recs), sum(r.credits for r in recs))
        finally:
            await other.close()
            await store.close()

    asyncio.run(go())


def test_percentiles_exact_and_sampled(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = records(4000, 8, seed=11)

    def exact(
        pick: Callable[[UsageRecord], bool], value: Callable[[UsageRecord], float | None]
    ) -> dict[int, float]:
        values = sorted(v for r in recs if pick(r) and (v := value(r)) is not None)
        return {p: percentile(values, p) for p in (50, 90, 99)}

    async def go() -> None:
        async with loaded(store_url, recs) as (store, a):
            group = Filter(1)
            answered = (await a.total(group)).ok
            got = await a.latency(group, answered)
            in_group = lambda r: r.group_id == 1 and r.status == "ok"  # noqa: E731
            assert got.exact and got.count == answered
            assert got.latency == pytest.approx(exact(in_group, lambda r: r.latency_ms))
            assert got.ttft == pytest.approx(exact(in_group, lambda r: r.ttft_ms))
            monkeypatch.setattr(analysis, "EXACT", 100)
            sampled = await a.latency(Filter(), (await a.total(Filter())).ok)
            assert not sampled.exact and 0.9 * analysis.SAMPLE < sampled.read <= analysis.SAMPLE
            truth = exact(lambda r: r.status == "ok", lambda r: r.latency_ms)
            for p in (50, 90):
                assert sampled.latency[p] == pytest.approx(truth[p], rel=0.1)
            assert sampled == await a.latency(Filter(), (await a.total(Filter())).ok)  # stable

    asyncio.run(go())


def test_batch_totals_are_kept_up_to_the_watermark_and_equal_the_records(store_url: str) -> None:
    """A batch's totals: the records below the rollups' watermark are summed once and kept
    (usage_batch_totals), those above are read; both together equal the records, at every watermark,
    and a kept part is not summed again (its records deleted, the totals stay)."""
    recs = [replace(r, batch_id=("b1", "b2", None)[i % 3]) for i, r in enumerate(records(900, 10, seed=3))]

    def want(batch: str, among: list[UsageRecord]) -> Totals:
        out = Totals()
        for r in among:
            if r.batch_id == batch:
                out.add(
                    (
                        1,
                        r.status in ("error", "interrupted"),
                        r.status == "rejected",
                        r.credits,
                        r.prompt_tokens,
                        r.completion_tokens,
                        r.cached_tokens,
                        r.reasoning_tokens,
                    )
                )
        return out

    async def go() -> None:
        async with loaded(store_url, recs) as (store, a):
            a.rollup._refreshed = float("inf")  # the watermarks below are the test's
            assert await a.batches(["b1", "b2", "b0"]) == {"b1": want("b1", recs), "b2": want("b2", recs)}
            assert await store.database.select("SELECT count(*) FROM usage_batch_totals") == [
                (0,)
            ]  # nothing rolled
            half = await a.rollup.refresh(now=T0 + 3600 * 5)
            assert await a.batches(["b1", "b2"]) == {"b1": want("b1", recs), "b2": want("b2", recs)}
            kept = await store.database.select(
                "SELECT batch_id, upto, calls FROM usage_batch_totals ORDER BY batch_id"
            )
            ids = await store.database.select(
                "SELECT id, batch_id FROM usage WHERE id <= ? AND batch_id IS NOT NULL", (half,)
            )
            assert kept == [
                ("b1", half, sum(1 for _, b in ids if b == "b1")),
                ("b2", half, sum(1 for _, b in ids if b == "b2")),
            ]
            await a.rollup.refresh(now=T0 + 3600 * 100)
            everything = {"b1": want("b1", recs), "b2": want("b2", recs)}
            assert await a.batches(["b1", "b2"]) == everything
            await store.database.write("DELETE FROM usage WHERE batch_id = 'b1'")  # kept: not summed again
            assert await a.batches(["b1", "b2"]) == everything

    asyncio.run(go())
