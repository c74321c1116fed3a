"""The shared deployment state: every replica's calls in flight, cooldowns, latencies and RPM/TPM
ceilings in one Redis (gateway/upstream_state.py says what they are).

A call costs one round trip: ``acquire`` is one ``EVALSHA`` of :data:`ACQUIRE`, which walks the
call's order of deployments and takes the first that is not cooling down and has room under its
ceilings, atomically, and answers every candidate's load (kept as this replica's view for the next
call's strategy). ``release`` (:data:`RELEASE`) is never waited for: it goes with the next round trip.
Acquires and releases that arrive while a round trip is in flight go together in the next one, on
one connection (gateway/redis_scripts.py). Time comes from the Redis server (``TIME``), so replicas with skewed
clocks agree.

Per deployment, one hash (``rt`` / ``tt``: the TATs of its RPM / TPM buckets; ``c:<model>``: the end
of its rest for that model, all in server microseconds; ``l:<model>``: its latency average for that
model in seconds: streams' time to first byte; ``p:<model>``: non-stream calls' seconds per output
token) and one sorted set (the calls in flight, each scored with the time it stops
counting: a replica that dies leaves nothing behind for longer than :data:`LEASE_SECONDS`). All of a provider group's keys share one hash tag,
so the scripts also run on a Redis Cluster.

When Redis cannot be reached, calls are routed on this process's own state (MemoryState) and the
failure is logged (at most every 10 s) and counted in ``router_routing_state_errors_total``.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis

from core import metrics
from core.deployments import Deployment
from gateway.redis_scripts import ScriptPipe, sha
from gateway.routing import IDLE, Load
from gateway.upstream_state import Lease, MemoryState, UpstreamState

LEASE_SECONDS = 900  # a call in flight counts this long at most (a crashed replica's calls, then none)
KEEP_MS = 3_600_000  # a deployment's hash lives this long after its last write (its latency is kept)

# KEYS[2i-1], KEYS[2i]: the hash and the in-flight set of candidate i.  ARGV[1]: the call's tokens,
# ARGV[2]: its lease token, ARGV[3]: lease seconds, ARGV[4]: its model, then per candidate its RPM
# and TPM ceilings.
# Returns {chosen (1-based; 0: none), soonest wait in µs (-1: never), then per candidate:
# in flight, latency (seconds, "" if unknown), cooldown left (µs), headroom (millionths), seconds per
# output token ("" if unknown)}.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = 60000000
local tokens = tonumber(ARGV[1])
local cfield, lfield, pfield = 'c:' .. ARGV[4], 'l:' .. ARGV[4], 'p:' .. ARGV[4]
local n = #KEYS / 2
local chosen, soonest = 0, -1
local out = {0, -1}
for i = 1, n do
  local h, f = KEYS[2 * i - 1], KEYS[2 * i]
  local rpm, tpm = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local v = redis.call('HMGET', h, cfield, 'rt', 'tt', lfield, pfield)
  local cool = tonumber(v[1]) or 0
  local rt = math.max(tonumber(v[2]) or now, now)
  local tt = math.max(tonumber(v[3]) or now, now)
  redis.call('ZREMRANGEBYSCORE', f, '-inf', now)
  if chosen == 0 then
    local wait, never = 0, false
    local nrt, ntt = rt, tt
    if cool > now then
      wait = cool - now
    else
      if rpm > 0 then
        nrt = rt + period / rpm
        if nrt - period > now then wait = math.max(wait, nrt - period - now) end
      end
      if tpm > 0 then
        if tokens > tpm then never = true end
        ntt = tt + tokens * period / tpm
        if ntt - period > now then wait = math.max(wait, ntt - period - now) end
      end
    end
    if not never and wait == 0 then
      chosen = i
      rt, tt = nrt, ntt
      if rpm > 0 then redis.call('HSET', h, 'rt', string.format('%.0f', rt)) end
      if tpm > 0 then redis.call('HSET', h, 'tt', string.format('%.0f', tt)) end
      redis.call('ZADD', f, now + tonumber(ARGV[3]) * 1000000, ARGV[2])
      redis.call('PEXPIRE', h, KEEP)
      redis.call('PEXPIRE', f, tonumber(ARGV[3]) * 1000)
    elseif not never and (soonest < 0 or wait < soonest) then
      soonest = wait
    end
  end
  local left = 1
  if rpm > 0 then left = math.min(left, 1 - (rt - now) / period) end
  if tpm > 0 then left = math.min(left, 1 - (tt - now) / period) end
  if left < 0 then left = 0 end
  out[5 * i - 2] = redis.call('ZCARD', f)
  out[5 * i - 1] = v[4] or ''
  out[5 * i] = math.max(cool - now, 0)
  out[5 * i + 1] = math.floor(left * 1000000)
  out[5 * i + 2] = v[5] or ''
end
out[1] = chosen
out[2] = math.ceil(soonest)
return out
""".replace("KEEP", str(KEEP_MS))

# KEYS: the deployment's hash and in-flight set.  ARGV: lease token, latency seconds ("" if none),
# cooldown µs, the latency sample's weight, the model, seconds per output token ("" if none).
RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
for _, pair in ipairs({{2, 'l:'}, {6, 'p:'}}) do
  local s = tonumber(ARGV[pair[1]] or '')
  if s then
    local old = tonumber(redis.call('HGET', KEYS[1], pair[2] .. ARGV[5]))
    if old then s = old + tonumber(ARGV[4]) * (s - old) end
    redis.call('HSET', KEYS[1], pair[2] .. ARGV[5], string.format('%.9f', s))
  end
end
local cooldown = tonumber(ARGV[3])
if cooldown > 0 then
  local t = redis.call('TIME')
  local till = tonumber(t[1]) * 1000000 + tonumber(t[2]) + cooldown
  local cur = tonumber(redis.call('HGET', KEYS[1], 'c:' .. ARGV[5])) or 0
  if till > cur then redis.call('HSET', KEYS[1], 'c:' .. ARGV[5], string.format('%.0f', till)) end
end
redis.call('PEXPIRE', KEYS[1], KEEP)
return 1
""".replace("KEEP", str(KEEP_MS))

_ACQUIRE_SHA, _RELEASE_SHA = sha(ACQUIRE), sha(RELEASE)
_US = 1_000_000
log = logging.getLogger("gateway.routing")


def _seconds(value: bytes | str) -> float | None:
    return float(value) if value not in (b"", "") else None


class RedisState(UpstreamState):
    shared = True

    def __init__(
        self,
        url: str,
        prefix: str = "router:dep",
        timeout: float = 0.25,
        alpha: float = 0.3,
        lease_seconds: int = LEASE_SECONDS,
    ) -> None:
        self.prefix = prefix.rstrip(":")
        self.timeout = timeout
        self.alpha = alpha
        self.lease_seconds = lease_seconds
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=max(timeout, 1.0), health_check_interval=30
        )
        self.local = MemoryState(alpha)  # while Redis cannot be reached
        self._loads: dict[tuple[str, str], Load] = {}  # (deployment, model), as of the last answer
        self._rest_until: dict[tuple[str, str], float] = {}  # monotonic
        self._keys: dict[str, tuple[str, str]] = {}
        self.pipe = ScriptPipe(self.client, [ACQUIRE, RELEASE], timeout, self._failed)
        self._warned = 0.0

    def _names(self, dep: Deployment) -> tuple[str, str]:
        names = self._keys.get(dep.key)
        if names is None:  # one hash tag per provider group: a Redis Cluster keeps its keys together
            base = f"{self.prefix}:{{{dep.prefix}}}:{dep.key}"
            names = self._keys[dep.key] = (base, base + ":f")
        return names

    def load(self, dep: Deployment, model: str) -> Load:
        return self._loads.get((dep.key, model), IDLE)

    def resting(self, dep: Deployment) -> dict[str, float]:
        now = time.monotonic()
        out = {
            m: until - now
            for (key, m), until in list(self._rest_until.items())
            if key == dep.key and until > now
        }
        for m, seconds in self.local.resting(dep).items():
            out[m] = max(out.get(m, 0.0), seconds)
        return out

    async def acquire(self, order: Sequence[Deployment], model: str, tokens: int) -> Lease | float:
        token = secrets.token_hex(8)
        keys: list[str] = []
        args: list[Any] = [tokens, token, self.lease_seconds, model]
        for dep in order:
            keys += self._names(dep)
            args += (dep.rpm, dep.tpm)
        try:
            out = await self.pipe.call(_ACQUIRE_SHA, keys, args)
        except Exception as exc:  # Redis is out of reach: this process routes on what it knows
            self._failed(exc)
            return self.local.acquire_now(order, model, tokens)
        now = time.monotonic()
        for i, dep in enumerate(order):
            in_flight, latency, rest, left, per_token = out[5 * i + 2 : 5 * i + 7]
            self._loads[(dep.key, model)] = Load(
                int(in_flight), _seconds(latency), int(left) / _US, _seconds(per_token)
            )
            if int(rest):
                self._rest_until[(dep.key, model)] = now + int(rest) / _US
            else:
                self._rest_until.pop((dep.key, model), None)
        chosen = int(out[0])
        if chosen:
            return Lease(order[chosen - 1], model, self, token)
        return math.inf if int(out[1]) < 0 else int(out[1]) / _US

    def _release(self, lease: Lease, latency: float | None, cooldown: float, per_token: float | None) -> None:
        if cooldown > 0:  # this replica's view has it at once (Redis's, with the next round trip)
            key = (lease.deployment.key, lease.model)
            self._rest_until[key] = max(self._rest_until.get(key, 0.0), time.monotonic() + cooldown)
        args = [
            lease.token,
            "" if latency is None else f"{latency:.6f}",
            int(cooldown * _US),
            self.alpha,
            lease.model,
            "" if per_token is None else f"{per_token:.9f}",
        ]
        self.pipe.send(_RELEASE_SHA, self._names(lease.deployment), args)

    def _failed(self, exc: BaseException) -> None:
        metrics.routing_state_error()
        now = time.monotonic()
        if now - self._warned > 10:
            self._warned = now
            log.warning(
                "routing state unavailable in Redis (%s: %s); deployments are chosen on this "
                "process's own state",
                type(exc).__name__,
                exc,
            )

    async def close(self) -> None:
        await self.pipe.close()
        await self.client.aclose()
