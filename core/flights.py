"""Reads shared by the callers who ask for the same thing at the same time.

A cache that expires, or a check that must see the store "now", sends every concurrent caller to the
store at once: 10,000 calls arriving together with a cold key cache were 10,000 lookups of one key,
and a flood of calls refused for want of credit was a balance read each, which one tenant could
use to queue every other tenant's reads behind its own. :class:`Flights` gives each caller the
result of a read that started after it asked (never an older one, so a revocation or a top-up it
might have missed is seen exactly as by a read of its own), with at most one read of a key running
at a time: callers who ask while one runs share the next, so any number of them cost two reads.

A caller cancelled while it waits leaves the read running for the others; a read that fails fails
for everyone who shares it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _retrieve(flight: asyncio.Future[Any]) -> None:
    if not flight.cancelled():
        flight.exception()  # (nobody may be left to await it: not "never retrieved")


class Flights(Generic[T]):
    def __init__(self) -> None:
        self._next: dict[Hashable, asyncio.Future[T]] = {}  # not started: whoever asks now shares it
        self._running: dict[Hashable, asyncio.Future[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def fresh(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """The result of ``read()`` (or of an identical read for ``key``) started after this call."""
        flight = self._next.get(key)
        if flight is None:
            flight = self._next[key] = asyncio.get_running_loop().create_future()
            flight.add_done_callback(_retrieve)
            task = asyncio.ensure_future(self._fly(key, flight, read))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(flight)

    def ahead(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> None:
        """Start a read for ``key`` now unless one is running or about to, and wait for none: a cache
        refreshed before it expires, so that no caller waits while its value is still good (``read``
        puts its result where it belongs; a failure is dropped: the next caller reads again)."""
        if key in self._next or key in self._running:
            return
        task = asyncio.ensure_future(self.fresh(key, read))
        task.add_done_callback(_retrieve)

    async def _fly(self, key: Hashable, flight: asyncio.Future[T], read: Callable[[], Awaitable[T]]) -> None:
        before = self._running.get(key)  # (none can start meanwhile: the next read to start is this one)
        if before is not None:
            await asyncio.wait([before])  # it started before some of ours asked
        del self._next[key]  # from here on, askers need a read that starts after this one
        self._running[key] = flight
        try:
            result = await read()
        except asyncio.CancelledError:
            flight.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every caller sharing it
            flight.set_exception(exc)
        else:
            flight.set_result(result)
        finally:
            if self._running.get(key) is flight:
                del self._running[key]
