"""Many small Lua script calls on one Redis connection, for the state replicas share (rate limits,
gateway/ratelimit_redis.py; deployments, gateway/upstream_state_redis.py).

Calls that arrive while a round trip is in flight go together in the next one (a pipeline of
``EVALSHA``, not a transaction), so a burst costs few round trips and there is no pool to exhaust. A
script the server does not have (first use, or it restarted or flushed its scripts) is loaded and
its calls sent again. ``call`` is awaited for its answer; ``send`` is not (its failure goes to
``on_error``); ``later`` goes with the next round trip or a few milliseconds later, its answer a future
for a done callback.

A round trip takes a connection of the client's pool, writes the batch's commands at once, packed
here (``evalsha``), and reads one reply per command; anything that goes wrong halfway (a timeout, a
lost connection, a cancellation) closes that connection, so no reply is ever read by the wrong
call. redis-py's pipeline did the same with more work per command (its packing encodes every
argument through a generic encoder, and each reply read starts a timer of its own): 43 -> 26 us of
CPU per rate limit check at 8 concurrent (a check of 4 buckets, 3 x 4,000 of them, process time).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

Op = tuple[str, Sequence[str], Sequence[Any], "asyncio.Future[Any] | None"]  # (sha, keys, args, waiter)


def evalsha(
    script_sha: str, keys: Sequence[str], args: Sequence[Any], encode: Callable[[Any], bytes]
) -> bytes:
    """``EVALSHA`` of these keys and arguments in the Redis protocol (RESP); ``encode``: the client's
    encoder, for anything but str, int and float (it refuses what Redis cannot take)."""
    items = [script_sha.encode(), b"%d" % len(keys), *[key.encode() for key in keys]]
    for arg in args:
        kind = type(arg)
        items.append(
            arg.encode()
            if kind is str
            else repr(arg).encode()
            if kind is int or kind is float
            else encode(arg)
        )
    return b"".join(
        [
            b"*%d\r\n$7\r\nEVALSHA\r\n" % (len(items) + 1),
            *[b"$%d\r\n%s\r\n" % (len(item), item) for item in items],
        ]
    )


def sha(script: str) -> str:
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


class ScriptPipe:
    def __init__(
        self,
        client: Any,
        scripts: Iterable[str],
        timeout: float,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.client = client
        self.scripts = list(scripts)
        self.timeout = timeout  # seconds per round trip before its calls fail
        self.on_error = on_error
        self._pending: list[Op] = []
        self._flusher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # a flush of what :meth:`later` queued

    def call(self, script_sha: str, keys: Sequence[str], args: Sequence[Any]) -> asyncio.Future[Any]:
        """The script's answer, with the next round trip (an exception if the round trip failed)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue((script_sha, keys, args, future))
        return future

    def send(self, script_sha: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Run the script with the next round trip; nobody waits for it."""
        self._queue((script_sha, keys, args, None))

    def later(
        self, script_sha: str, keys: Sequence[str], args: Sequence[Any], delay: float = 0.005
    ) -> asyncio.Future[Any]:
        """Like :meth:`call`, but with the next round trip that goes anyway, or within ``delay`` seconds
        (what nobody waits for need not cost a round trip of its own). Its failure goes to the future
        it returns (read in a done callback, say), not to ``on_error``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((script_sha, keys, args, future))
        if self._timer is None and (self._flusher is None or self._flusher.done()):
            self._timer = loop.call_later(delay, self._kick)
        return future

    def _kick(self) -> None:
        self._timer = None
        if self._pending and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.ensure_future(self._flush())

    def _queue(self, op: Op) -> None:
        self._pending.append(op)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                async with asyncio.timeout(self.timeout):
                    results = await self._run(batch)
                    missing = [n for n, r in enumerate(results) if isinstance(r, NoScriptError)]
                    if missing:  # first use, or the server was restarted or flushed its scripts
                        for script in self.scripts:
                            await self.client.script_load(script)
                        again = await self._run([batch[n] for n in missing])
                        for n, result in zip(missing, again, strict=True):
                            results[n] = result
            except Exception as exc:  # every waiter learns why
                for *_, future in batch:
                    self._settle(future, exc)
                continue
            for (*_, future), result in zip(batch, results, strict=True):
                self._settle(future, result)

    def _settle(self, future: asyncio.Future[Any] | None, result: Any) -> None:
        failed = isinstance(result, BaseException)
        if future is None:
            if failed and self.on_error is not None:
                self.on_error(result)
        elif not future.done():  # (done: its caller went away)
            if failed:
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _run(self, batch: list[Op]) -> list[Any]:
        """Each call's reply, or the error Redis answered it with (``NoScriptError``, say)."""
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        try:
            encode = conn.encoder.encode
            await conn.send_packed_command(
                b"".join([evalsha(script_sha, keys, args, encode) for script_sha, keys, args, _ in batch]),
                check_health=False,
            )
            results: list[Any] = []
            for _ in batch:
                try:  # (no timer per reply: the whole round trip has one, in _flush)
                    results.append(await conn.read_response(timeout=math.inf))
                except ResponseError as exc:
                    results.append(exc)
            return results
        except BaseException:  # replies may be left on the wire: this connection is done
            await conn.disconnect(nowait=True)
            raise
        finally:
            await pool.release(conn)

    async def close(self) -> None:
        """Let the round trip in flight (and what queued behind it) finish, for a while."""
        if self._timer is not None:
            self._timer.cancel()
            self._kick()
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait((self._flusher,), timeout=self.timeout * 2 + 1)
