"""A store full of history for the console bench: groups and keys made through the store's API, then
``rows`` usage records spread evenly over ``days`` days up to now, loaded in bulk
(:mod:`bench.usage_rows`), and a few batches in the jobs store.

The records look like a gateway's: each key calls two or three models of its own (a few keys call
many), a fifth of the calls come from batch jobs (with their batch's id), some stream (with a time to
first token), ~3 % fail, ~1 % are rejected, latencies are log-normal, some calls name an end user.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from bench.usage_rows import load, rows_of
from billing.store import Store, UsageRecord

MODELS = [
    "openai/gpt-4o-mini",
    "openai/gpt-4.1",
    "openai/gpt-5-mini",
    "anthropic/claude-sonnet-4-5",
    "anthropic/claude-haiku-4-5",
    "google/gemini-2.5-flash",
    "google/gemini-2.5-pro",
    "mistral/mistral-small-latest",
    "mistral/mistral-large-latest",
    "upstage/solar-pro2",
]
GROUPS = ["acme", "globex", "initech", "umbrella", "hooli", "stark"]
KEYS_PER_GROUP = 10
CHUNK = 100_000


@dataclass(frozen=True, slots=True)
class Seeded:
    groups: dict[str, int]  # name -> id
    keys: dict[int, int]  # key id -> group id
    batches: list[str]
    first_ts: float
    last_ts: float


async def seed(
    store: Store, rows: int, days: float = 90.0, now: float | None = None, seed: int = 22
) -> Seeded:
    rnd = random.Random(seed)
    now = time.time() if now is None else now
    groups: dict[str, int] = {}
    keys: dict[int, int] = {}
    for name in GROUPS:
        group = await store.create_group(name, 10**9 * 10**6)
        groups[name] = group.id
        for k in range(KEYS_PER_GROUP):
            info = await store.create_key(name, f"{name}-key-{k}", f"hash-{name}-{k}", f"sk-…{k:04d}")
            keys[info.id] = group.id
    key_ids = sorted(keys)
    weights = [rnd.paretovariate(1.2) for _ in key_ids]  # a few keys make most of the calls
    favourites = {k: rnd.sample(MODELS, 2 if rnd.random() < 0.7 else 3) for k in key_ids}
    batches = [f"batch_bench{n:04d}" for n in range(40)]
    start = now - days * 86400
    step = days * 86400 / max(rows, 1)
    first = start
    for at in range(0, rows, CHUNK):
        chunk = []
        for i in range(at, min(at + CHUNK, rows)):
            key = rnd.choices(key_ids, weights)[0] if i % 7 else rnd.choice(key_ids)
            model = rnd.choice(MODELS) if rnd.random() < 0.03 else rnd.choice(favourites[key])
            job = rnd.random() < 0.2
            stream = not job and rnd.random() < 0.35
            roll = rnd.random()
            status = (
                "rejected"
                if roll < 0.01
                else "error"
                if roll < 0.035
                else "interrupted"
                if roll < 0.04
                else "ok"
            )
            latency = rnd.lognormvariate(6.3, 0.7)
            prompt = int(rnd.lognormvariate(6, 1.1)) + 1
            out = 0 if status == "rejected" else int(rnd.lognormvariate(5, 0.9))
            chunk.append(
                UsageRecord(
                    key_id=key,
                    group_id=keys[key],
                    model=model,
                    provider=model.split("/")[0],
                    endpoint="responses" if rnd.random() < 0.15 else "chat",
                    source="job" if job else "api",
                    stream=stream,
                    prompt_tokens=0 if status == "rejected" else prompt,
                    completion_tokens=out,
                    cached_tokens=prompt // 3 if rnd.random() < 0.2 else 0,
                    reasoning_tokens=out // 2 if "gpt-5" in model else 0,
                    credits=0
                    if status == "rejected"
                    else (prompt * 150 + out * 600) * (3 if "sonnet" in model or "pro" in model else 1),
                    status=status,
                    latency_ms=latency if status != "rejected" else rnd.uniform(0.3, 3),
                    ttft_ms=latency * rnd.uniform(0.1, 0.4) if stream and status == "ok" else None,
                    request_id=f"req_{rnd.getrandbits(96):024x}",
                    error={
                        "error": "The provider 'openai' failed: 503",
                        "interrupted": "the call did not complete",
                        "rejected": "Insufficient credits",
                    }.get(status),
                    error_code={"error": "upstream_error", "rejected": "insufficient_credits"}.get(status),
                    batch_id=batches[i * len(batches) // rows] if job else None,
                    end_user=f"user-{rnd.randint(1, 500)}" if rnd.random() < 0.3 else None,
                    ts=start + i * step + rnd.uniform(0, step),
                )
            )
        await load(store, rows_of(chunk))
    return Seeded(groups, keys, batches, first, now)
