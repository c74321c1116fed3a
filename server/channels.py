"""The waitable objects hypercorn makes for every request and every connection, without asyncio's
deques (with :mod:`server.fast_http1`, what the gateway's processes run).

For every request hypercorn opens an ``asyncio.Queue`` between the connection and the app (the
request's body and its ``http.disconnect`` go through it), and for every connection an
``asyncio.Event`` (reading is paused while the app has not taken what was read). A queue holds three
``collections.deque`` (its items, its waiting getters, its waiting putters) and an ``asyncio.Event``
for ``join``, which holds a fourth; each deque allocates a block of 64 slots up front, ~760 bytes. For
an open stream that is five deques, ~3.7 KB of the ~45 KB the process holds per stream, for queues
that hold at most a couple of messages and almost never more than one waiter.

- :class:`Channel` is ``asyncio.Queue``'s ``get`` and ``put`` (bounded, first in first out, waiters
  woken in order, a cancelled waiter handing its wake-up on) over lists made when first needed.
  hypercorn never calls ``join``, ``task_done`` or the ``_nowait`` forms on it. One thing more,
  :meth:`Channel.watch`: the items handed to a function as they come, for an app that would otherwise
  keep a task waiting on ``receive`` for as long as it answers (``router.replies.SSE``, through the scope's extension ``core.types.RECEIVE_WATCH``: the caller's
  disconnect ends a stream at once).
- :class:`Event` is hypercorn's ``EventWrapper`` (``set``, ``clear``, ``wait``, ``is_set``) without
  the ``asyncio.Event`` inside it.
- :func:`spawn_app` is hypercorn's ``TaskGroup.spawn_app`` with a :class:`Channel`.

``tests/test_channels.py`` runs each against asyncio's own on generated sequences of calls, waits and
cancellations and compares everything a caller can see. :func:`install` puts them where hypercorn
looks them up; ``server.serve`` calls it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import hypercorn.asyncio.task_group as hypercorn_task_group
from hypercorn.asyncio.worker_context import WorkerContext

from core.types import RECEIVE_WATCH

TaskGroup = hypercorn_task_group.TaskGroup
ORIGINAL_SPAWN_APP = TaskGroup.spawn_app
ORIGINAL_EVENT_CLASS = WorkerContext.event_class


def _wake_next(waiters: list[asyncio.Future[None]] | None) -> None:
    """Wake the first waiter that still waits (asyncio.Queue's ``_wakeup_next``)."""
    while waiters:
        waiter = waiters.pop(0)
        if not waiter.done():
            waiter.set_result(None)
            break


def _leave(waiters: list[asyncio.Future[None]], waiter: asyncio.Future[None], room: bool) -> None:
    """``waiter`` is going (cancelled while it waited): off the list, and if it had been woken and
    there is ``room`` for what it waited for, the next one is woken instead (asyncio.Queue's rule)."""
    waiter.cancel()  # (if it is not done yet)
    try:
        waiters.remove(waiter)
    except ValueError:
        pass  # woken already: taken off the list then
    if room and not waiter.cancelled():
        _wake_next(waiters)


class Channel:
    """``asyncio.Queue(maxsize)``'s ``get`` and ``put``, with the same order, bound and wake-ups."""

    __slots__ = ("_items", "_maxsize", "_getters", "_putters", "_watcher")

    def __init__(self, maxsize: int = 0) -> None:
        self._items: list[Any] = []
        self._maxsize = maxsize
        self._getters: list[asyncio.Future[None]] | None = None
        self._putters: list[asyncio.Future[None]] | None = None
        self._watcher: Callable[[Any], None] | None = None

    def watch(self, watcher: Callable[[Any], None] | None) -> None:
        """Hand every item to ``watcher`` as it is put (those in the channel first) instead of keeping
        it for ``get``, until ``watch(None)``: what a task calling ``get`` in a loop would see, without
        the task. (An SSE response watches for the caller's ``http.disconnect`` so for a whole stream.)
        A ``put`` that was waiting for room hands its item on when it runs, after any put made
        meanwhile: hypercorn's one producer awaits each put, so it never has two under way."""
        self._watcher = watcher
        if watcher is not None:
            while self._items:
                watcher(self._items.pop(0))
            while self._putters:  # each hands its item to the watcher when it runs
                _wake_next(self._putters)

    def qsize(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return 0 < self._maxsize <= len(self._items)

    async def put(self, item: Any) -> None:
        while self.full():
            if self._putters is None:
                self._putters = []
            putter = asyncio.get_running_loop().create_future()
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                _leave(self._putters, putter, not self.full())
                raise
        if self._watcher is not None:
            self._watcher(item)
            return
        self._items.append(item)
        _wake_next(self._getters)

    async def get(self) -> Any:
        while not self._items:
            if self._getters is None:
                self._getters = []
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                _leave(self._getters, getter, bool(self._items))
                raise
        item = self._items.pop(0)
        _wake_next(self._putters)
        return item


class Event:
    """hypercorn's ``EventWrapper``: ``asyncio.Event``'s rules (``set`` wakes every waiter, ``clear``
    none; a waiter woken returns even if the event was cleared since), its waiters in a list made
    when first needed."""

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    async def clear(self) -> None:
        self._value = False

    async def wait(self) -> None:
        if self._value:
            return
        if self._waiters is None:
            self._waiters = []
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)

    async def set(self) -> None:
        if not self._value:
            self._value = True
            for waiter in self._waiters or ():
                if not waiter.done():
                    waiter.set_result(True)

    def is_set(self) -> bool:
        return self._value


async def spawn_app(
    self: Any, app: Any, config: Any, scope: Any, send: Callable[[Any], Awaitable[None]]
) -> Callable[[Any], Awaitable[None]]:
    """hypercorn's ``TaskGroup.spawn_app``, the app's receive channel a :class:`Channel`, whose
    :meth:`Channel.watch` the scope offers as the extension ``core.types.RECEIVE_WATCH``."""
    channel = Channel(config.max_app_queue_size)
    loop = self._loop

    def _call_soon(func: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(func(*args), loop).result()

    extensions = scope.get("extensions")
    if extensions is not None:
        extensions[RECEIVE_WATCH] = {"watch": channel.watch}
    self.spawn(
        hypercorn_task_group._handle,
        app,
        config,
        scope,
        channel.get,
        send,
        partial(loop.run_in_executor, None),
        _call_soon,
    )
    return channel.put


def install() -> None:
    setattr(TaskGroup, "spawn_app", spawn_app)  # noqa: B010
    WorkerContext.event_class = Event  # type: ignore[assignment]
