"""The shared count of calls in flight (gateway/concurrency.py) in Redis, for several gateway replicas.

Each count (a key's, a group's) is a sorted set: one member per call in flight, scored with the time
(Redis ``TIME``, µs) its place expires. ``ENTER`` drops the expired members of the call's sets, and
adds the call to every set if none is full, atomically; ``LEAVE`` removes it when the call ends. While
its calls run, a replica renews their expiry every quarter of ``lease`` seconds (``RENEW``, one
script call per set, together in one round trip), so a call may last as long as it likes, and the
places of a replica that died expire within ``lease``. A ``LEAVE`` that fails (Redis frozen or
unreachable when the call ended) is kept in memory and sent again before this replica's next
``ENTER``, in the same round trip, and with each ``RENEW``: once Redis answers again, the calls that
ended meanwhile no longer hold their places (until then, or if the replica dies first, the lease ends
them). A call's sets share its group's hash tag: the scripts run on a Redis Cluster. All three go
through one :class:`~gateway.redis_scripts.ScriptPipe`, the rate limits' when they use Redis too
(``ENTER`` is awaited, in the same round trip as the rate limits' check; ``LEAVE`` goes with the next
round trip, or 5 ms later; ``RENEW`` is not awaited: its failures are logged and the lease ends what it
could not renew).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from functools import partial
from typing import Any

import redis.asyncio as redis

from gateway.concurrency import Backend, Place
from gateway.periodic import Periodic
from gateway.redis_scripts import ScriptPipe, sha

log = logging.getLogger("gateway.concurrency")

# KEYS[i]: a set of calls in flight.  ARGV[1]: the lease (µs); ARGV[2]: the call; ARGV[2 + i]: the limit of set i.
# Returns 0 when the call was added to every set; else i, the first set that is full (nothing added).
ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 + i]) then return i end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + lease, ARGV[2])
  redis.call('PEXPIRE', KEYS[i], math.ceil(lease / 1000) + 1000)
end
return 0
"""

# KEYS[i]: a set the call ARGV[1] is in.
LEAVE = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 0
"""

# KEYS[1]: a set.  ARGV[1]: the lease (µs); ARGV[2...]: this replica's calls in it that still run.
RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
return 0
"""

_ENTER, _LEAVE, _RENEW = sha(ENTER), sha(LEAVE), sha(RENEW)
_US = 1_000_000
LEASE = 60.0  # seconds a place outlives its replica's last renewal


class RedisBackend(Backend):
    def __init__(
        self,
        url: str,
        prefix: str = "router:rl",
        timeout: float = 0.25,
        lease: float = LEASE,
        pipe: ScriptPipe | None = None,
    ) -> None:
        """``pipe``: another's (the rate limits', gateway/ratelimit_redis.py) to share, with its
        connection: a call's two checks then go in one round trip. Closed by its owner."""
        self.namespace = prefix.rstrip(":") + ":" if prefix else ""
        self.lease = lease
        self.lease_us = int(lease * _US)
        self.owned = pipe is None
        if pipe is None:
            client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=max(timeout, 1.0),
                health_check_interval=30,
            )
            pipe = ScriptPipe(client, [], timeout, on_error=self._failed)
        pipe.scripts += [ENTER, LEAVE, RENEW]  # (loaded again when the server lost them)
        self.pipe = pipe
        self.client: Any = pipe.client
        self.live: dict[str, set[str]] = {}  # set name -> this replica's calls in it that run now
        # calls that ended but whose LEAVE failed -> (their sets, when it first failed): sent again
        self.unreleased: dict[str, tuple[Sequence[str], float]] = {}
        self.renewer = Periodic("concurrency-renew", lease / 4, self.renew, final=False)
        self._warned = 0.0

    def enter(self, places: list[Place], member: str) -> Awaitable[int]:
        args: list[Any] = [self.lease_us, member]
        args += [place.limit for place in places]
        names = [place.name for place in places]
        if self.unreleased:  # ahead of this ENTER, in its round trip: the places they held are free for it
            self._replay()
        return self._entered(self.pipe.call(_ENTER, names, args), places, names, member)  # queued now

    async def _entered(
        self, answer: asyncio.Future[Any], places: list[Place], names: list[str], member: str
    ) -> int:
        try:
            full = int(await answer)
        except BaseException:  # the caller went away, or Redis failed: the script may have run all the same
            self._release(names, member)
            raise
        if full:
            return full - 1
        for place in places:
            self.live.setdefault(place.name, set()).add(member)
        self.renewer.start()
        return -1

    def leave(self, places: list[Place], member: str) -> None:
        for place in places:
            members = self.live.get(place.name)
            if members is not None:
                members.discard(member)
                if not members:
                    del self.live[place.name]
        self._release([place.name for place in places], member)  # (with the next call's check)

    def _release(self, names: Sequence[str], member: str, since: float | None = None) -> None:
        """``LEAVE`` with the next round trip; kept in :attr:`unreleased` if it fails."""
        answer = self.pipe.later(_LEAVE, names, [member])
        answer.add_done_callback(partial(self._released, names, member, since))

    def _released(
        self, names: Sequence[str], member: str, since: float | None, answer: asyncio.Future[Any]
    ) -> None:
        exc = answer.exception() if not answer.cancelled() else None
        if exc is not None:
            self.unreleased[member] = (names, time.monotonic() if since is None else since)
            self._failed(exc)

    def _replay(self) -> None:
        """Send the failed LEAVEs again (those older than the lease are moot: their places expired)."""
        now = time.monotonic()
        unreleased, self.unreleased = self.unreleased, {}
        for member, (names, since) in unreleased.items():
            if now - since < self.lease:
                self._release(names, member, since)

    async def renew(self) -> None:
        if self.unreleased:
            self._replay()
        for name, members in self.live.items():
            self.pipe.send(_RENEW, [name], [self.lease_us, *members])

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned < 10:
            return
        self._warned = now
        log.warning(
            "calls in flight: a Redis update failed (%s: %s); the places of calls that ended are "
            "given back when Redis answers, the others expire with their lease",
            type(exc).__name__,
            exc,
        )

    async def close(self) -> None:
        await self.renewer.stop()
        if self.owned:
            await self.pipe.close()
            await self.client.aclose()
