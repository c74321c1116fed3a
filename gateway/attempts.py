"""Attempts a guesser would repeat (the console's logins), counted in sliding windows before the check
they guard, and shared by every replica.

An attempt takes its place in each of its windows (a client IP's, an account's, a device's) first, or
none if one is full: then it is refused with the seconds until a place frees, and nothing is checked.
So guesses sent at once are bounded like guesses sent one after the other (a count made after the
check let every one of them through while the first were still being checked). Its caller may give
the place back and empty a window (a success does both: its client's count starts again).

Where the count lives: in Redis when ``[limits] redis_url`` is set (a sorted set per window, one Lua
script, the server's clock), else in the store (the ``attempts`` table, one transaction: a PostgreSQL
advisory lock or SQLite's write lock keeps it atomic across replicas). Either way a restart forgets
nothing, and replicas on one Redis or one database share the count. Redis unreachable: the store
counts meanwhile (logged at most every 10 s).
"""

from __future__ import annotations

import logging
import secrets
import time
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from billing.store import Database

log = logging.getLogger("gateway.attempts")

MIGRATIONS = [
    # 1: one row per attempt and window, until the window has moved past it
    "CREATE TABLE attempts (name TEXT NOT NULL, token TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (name, token)); CREATE INDEX attempts_expires ON attempts (expires)",
]
_LOCK = zlib.crc32(b"attempts")  # PostgreSQL: takes in one database run one at a time

# KEYS[i]: a window (a sorted set of attempts by time, µs).  ARGV[1]: the window's length (µs);
# ARGV[2]: the attempt; ARGV[2 + i]: the limit of window i. Returns 0 when the attempt took a place
# in every window; else the µs until a place frees in each full one (nothing taken).
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local span = tonumber(ARGV[1])
local wait = 0
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - span)
  local n = redis.call('ZCARD', KEYS[i])
  local limit = tonumber(ARGV[2 + i])
  if n >= limit then
    local freeing = redis.call('ZRANGE', KEYS[i], n - limit, n - limit, 'WITHSCORES')
    wait = math.max(wait, tonumber(freeing[2]) + span - now)
  end
end
if wait > 0 then return wait end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[i], math.ceil(span / 1000))
end
return 0
"""


class Window(NamedTuple):
    name: str  # what is counted: "login:ip:203.0.113.7", "login:account:admin", ...
    limit: int  # attempts per window


class Attempt(NamedTuple):
    token: str  # this attempt, in each of its windows ("" when refused)
    wait: int  # refused: seconds until a place frees; taken: 0
    stored: bool = False  # counted in the store although Redis is configured (it could not be reached)


def _wait(seconds: float) -> int:
    return max(1, int(seconds) + 1)


class StoreCount:
    """The windows in the store's ``attempts`` table (dialect-neutral SQL)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False

    async def ready(self) -> None:
        if not self._ready:
            await self.db.migrate("attempts_schema_version", MIGRATIONS)
            self._ready = True

    async def take(self, windows: Sequence[Window], seconds: float, token: str) -> int:
        await self.ready()
        now = time.time()
        names = [w.name for w in windows]
        rows = " UNION ALL ".join(["SELECT CAST(? AS TEXT) AS name"] * len(windows))
        room = " AND ".join(["(SELECT COUNT(*) FROM attempts WHERE name = ?) < ?"] * len(windows))
        steps: list[tuple[str, Sequence[Any]]] = []
        if self.db.dialect == "postgresql":
            steps.append(("SELECT pg_advisory_xact_lock(?)", (_LOCK,)))
        steps += [
            ("DELETE FROM attempts WHERE expires <= ?", (now,)),
            (
                f"INSERT INTO attempts (name, token, expires) SELECT w.name, CAST(? AS TEXT), "
                f"CAST(? AS DOUBLE PRECISION) FROM ({rows}) w WHERE {room}",
                [token, now + seconds, *names, *[v for w in windows for v in (w.name, w.limit)]],
            ),
        ]
        if (await self.db.atomic(steps))[-1]:
            return 0
        marks = ", ".join("?" * len(names))
        found = await self.db.select(
            f"SELECT name, expires FROM attempts WHERE name IN ({marks}) "
            "AND expires > ? ORDER BY expires DESC",
            [*names, now],
        )
        waits = [0.0]
        for w in windows:
            expiries = [float(e) for name, e in found if name == w.name]
            if len(expiries) >= w.limit:
                waits.append(expiries[w.limit - 1] - now)
        return _wait(max(waits))

    async def give_back(self, token: str, names: Sequence[str]) -> None:
        await self.ready()
        marks = ", ".join("?" * len(names))
        await self.db.write(f"DELETE FROM attempts WHERE token = ? AND name IN ({marks})", [token, *names])

    async def clear(self, names: Sequence[str]) -> None:
        await self.ready()
        await self.db.write(
            f"DELETE FROM attempts WHERE name IN ({', '.join('?' * len(names))})", list(names)
        )


class RedisCount:
    """The windows in Redis (one hash tag: the script runs on a Redis Cluster)."""

    def __init__(self, url: str, prefix: str, timeout: float) -> None:
        import redis.asyncio as redis

        self.namespace = (prefix.rstrip(":") + ":" if prefix else "") + "{attempts}:"
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=max(timeout, 1.0), health_check_interval=30
        )
        self.script = self.client.register_script(TAKE)

    async def take(self, windows: Sequence[Window], seconds: float, token: str) -> int:
        keys = [self.namespace + w.name for w in windows]
        args: list[str | int] = [int(seconds * 1_000_000), token, *[w.limit for w in windows]]
        wait = int(await self.script(keys=keys, args=args))
        return _wait(wait / 1_000_000) if wait > 0 else 0

    async def give_back(self, token: str, names: Sequence[str]) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zrem(self.namespace + name, token)
            await pipe.execute()

    async def clear(self, names: Sequence[str]) -> None:
        await self.client.delete(*[self.namespace + name for name in names])

    async def close(self) -> None:
        await self.client.aclose()


class Attempts:
    def __init__(
        self, db: Database, redis_url: str = "", prefix: str = "router:rl", timeout: float = 0.25
    ) -> None:
        self.store = StoreCount(db)
        self.redis = RedisCount(redis_url, prefix, timeout) if redis_url else None
        self._warned = 0.0

    async def take(self, windows: Sequence[Window], seconds: float) -> Attempt:
        """A place in each of ``windows`` (``seconds`` long) for one attempt, or the wait if one is full."""
        token = secrets.token_hex(8)
        if self.redis is not None:
            try:
                wait = await self.redis.take(windows, seconds, token)
                return Attempt("" if wait else token, wait)
            except Exception as exc:  # (redis-py's errors, OSError, a timeout)
                self._unshared(exc)
        wait = await self.store.take(windows, seconds, token)
        return Attempt("" if wait else token, wait, stored=self.redis is not None)

    async def give_back(self, attempt: Attempt, windows: Sequence[Window]) -> None:
        """``attempt``'s place in ``windows`` given back (a success)."""
        if not windows or not attempt.token:
            return
        names = [w.name for w in windows]
        if self.redis is not None and not attempt.stored:
            try:
                await self.redis.give_back(attempt.token, names)
                return
            except Exception as exc:
                self._unshared(exc)
        await self.store.give_back(attempt.token, names)

    async def clear(self, windows: Sequence[Window]) -> None:
        """Every attempt of ``windows`` forgotten (a success starts its client's count again)."""
        if not windows:
            return
        names = [w.name for w in windows]
        if self.redis is not None:
            try:
                await self.redis.clear(names)
                return
            except Exception as exc:
                self._unshared(exc)
        await self.store.clear(names)

    def _unshared(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned >= 10:
            self._warned = now
            log.warning(
                "attempts: Redis cannot be reached (%s: %s); counted in the store meanwhile",
                type(exc).__name__,
                exc,
            )

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()
