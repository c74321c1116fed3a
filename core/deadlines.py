"""Deadlines on the call path: many of them, one timer.

``asyncio.timeout`` arms and cancels a timer each time (about 6 µs here), and every call needs two
(its body must arrive, its upstream must answer) that almost never fire. A :class:`Deadlines` keeps
the open deadlines in a dict (about 1 µs each); one timer, armed while any is open, looks at them
every ``tick`` seconds and cancels the task of each one that has passed, which then raises
``TimeoutError`` where the deadline was opened, as ``asyncio.timeout`` does. A deadline so fires up
to one tick late.

    with gateway.deadlines.after(seconds):
        ...                                    # TimeoutError once ``seconds`` have passed

A deadline may be entered again once its block has ended (each entry counts its ``seconds`` from
then): one per relayed stream bounds each read of it.

One :class:`Deadlines` serves one event loop at a time (the gateway's); it follows the loop it is
used on.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

TICK = 0.05  # seconds between looks at the open deadlines


class Deadlines:
    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self._open: dict[Deadline, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def after(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` from when its ``with`` block is entered, for the task entering it."""
        return Deadline(self, seconds)

    def _open_one(self, deadline: Deadline, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # a new loop (tests run several, one after the other)
            self._open.clear()
            self._loop, self._timer = loop, None
        self._open[deadline] = None
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.tick, self._sweep)

    def _sweep(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for deadline in [d for d in self._open if d.when <= now]:
            del self._open[deadline]
            deadline.expire()
        self._timer = loop.call_at(now + self.tick, self._sweep) if self._open else None


class Deadline:
    """One deadline (a ``with`` block in one task); see :class:`Deadlines`."""

    __slots__ = ("owner", "seconds", "when", "task", "cancelling", "expired")

    def __init__(self, owner: Deadlines, seconds: float) -> None:
        self.owner = owner
        self.seconds = seconds
        self.expired = False

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be opened inside a task")
        loop = task.get_loop()
        self.task = task
        self.expired = False
        self.cancelling = task.cancelling()
        self.when = loop.time() + self.seconds
        self.owner._open_one(self, loop)
        return self

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.expired:
            self.owner._open.pop(self, None)
        elif self.task.uncancel() <= self.cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from exc
