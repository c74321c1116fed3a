"""The shared rate limit backend: GCRA buckets in Redis, for several gateway replicas.

A check is one ``EVALSHA`` of the script below, which checks every bucket of the call and takes from
all of them or from none, atomically; at most one round trip, shared with the checks that arrive
meanwhile (gateway/redis_scripts.py). Time comes from the Redis
server (``TIME``), so replicas with skewed clocks agree. Each bucket is one string key holding its
TAT in microseconds, expiring when the bucket is full again. All of a call's keys share one hash tag
(its group), so the script also runs on a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis

from gateway.ratelimit import NEVER, PERIOD, Backend, Bucket, BucketState
from gateway.redis_scripts import ScriptPipe, sha

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
SHA = sha(GCRA)


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
        # a failure reaches the waiter: the limiter fails open
        self.pipe = ScriptPipe(self.client, [GCRA], timeout)

    async def take(self, buckets: Sequence[Bucket]) -> tuple[bool, list[BucketState]]:
        args: list[int] = [self.period_us]
        for bucket in buckets:
            args += (bucket.limit, bucket.cost)
        out = await self.pipe.call(SHA, [b.name for b in buckets], args)
        states = []
        for i in range(len(buckets)):
            remaining, reset, retry = out[3 * i + 1], out[3 * i + 2], out[3 * i + 3]
            states.append(
                BucketState(int(remaining), int(reset) / _US, NEVER if retry < 0 else int(retry) / _US)
            )
        return bool(out[0]), states

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.pipe.close()
        await self.client.aclose()
