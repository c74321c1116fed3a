"""The shared rate limit backend: GCRA buckets in Redis, for several gateway replicas.

A check is one ``EVALSHA`` of the script below, which checks every bucket of the call and takes from
all of them or from none, atomically; at most one round trip. Checks that arrive while a round trip
is in flight are pipelined together into the next one (one connection, no pool to exhaust under a
burst); the script is loaded on first use and again if the server lost it. Time comes from the Redis
server (``TIME``), so replicas with skewed clocks agree. Each bucket is one string key holding its
TAT in microseconds, expiring when the bucket is full again. All of a call's keys share one hash tag
(its group), so the script also runs on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis
from redis.exceptions import NoScriptError

from gateway.ratelimit import NEVER, PERIOD, Backend, Bucket, BucketState

# KEYS[i]: the TAT of bucket i.  ARGV[1]: the period (µs); ARGV[2i], ARGV[2i+1]: limit, cost of bucket i.
# Returns {ok, then per bucket: remaining, reset (µs), retry after (µs; -1 = never)}.
GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = tonumber(ARGV[1])
local n = #KEYS
local ok = 1
local base, new, retry, interval = {}, {}, {}, {}
for i = 1, n do
  local limit = tonumber(ARGV[2 * i])
  local cost = tonumber(ARGV[2 * i + 1])
  interval[i] = period / limit
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  base[i] = tat
  new[i] = tat + cost * interval[i]
  if cost > limit then
    retry[i] = -1
    ok = 0
  elseif new[i] - period > now then
    retry[i] = new[i] - period - now
    ok = 0
  else
    retry[i] = 0
  end
end
local out = {ok}
for i = 1, n do
  local tat = base[i]
  if ok == 1 then
    tat = new[i]
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
  local left = math.floor((now + period - tat) / interval[i] + 1e-6)
  if left < 0 then left = 0 end
  out[3 * i - 1] = left
  out[3 * i] = math.ceil(tat - now)
  out[3 * i + 1] = math.ceil(retry[i])
end
return out
"""

_US = 1_000_000
SHA = hashlib.sha1(GCRA.encode()).hexdigest()

Check = tuple[list[str], list[int], "asyncio.Future[list[int]]"]


class RedisBackend(Backend):
    def __init__(
        self, url: str, prefix: str = "router:rl", timeout: float = 0.25, period: float = PERIOD
    ) -> None:
        self.namespace = prefix.rstrip(":") + ":" if prefix else ""
        self.period_us = int(period * _US)
        self.timeout = timeout
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=max(timeout, 1.0), health_check_interval=30
        )
        self._pending: list[Check] = []
        self._flusher: asyncio.Task[None] | None = None

    async def take(self, buckets: Sequence[Bucket]) -> tuple[bool, list[BucketState]]:
        args: list[int] = [self.period_us]
        for bucket in buckets:
            args += (bucket.limit, bucket.cost)
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append(([b.name for b in buckets], args, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        out = await future
        states = []
        for i in range(len(buckets)):
            remaining, reset, retry = out[3 * i + 1], out[3 * i + 2], out[3 * i + 3]
            states.append(
                BucketState(int(remaining), int(reset) / _US, NEVER if retry < 0 else int(retry) / _US)
            )
        return bool(out[0]), states

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                async with asyncio.timeout(self.timeout):
                    results = await self._run(batch)
                    missing = [n for n, r in enumerate(results) if isinstance(r, NoScriptError)]
                    if missing:  # first use, or the server was restarted or flushed its scripts
                        await self.client.script_load(GCRA)
                        again = await self._run([batch[n] for n in missing])
                        for n, result in zip(missing, again, strict=True):
                            results[n] = result
            except Exception as exc:  # every waiter learns why (the limiter then fails open)
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue  # its caller went away
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _run(self, batch: list[Check]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for keys, args, _ in batch:
                pipe.evalsha(SHA, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait((self._flusher,), timeout=self.timeout * 2 + 1)
        await self.client.aclose()
