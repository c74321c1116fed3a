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

The open deadlines are kept by their ``seconds`` (a few values: the configuration's), each set in the
order they were entered, which is the order they pass: a look stops at the first of each set that
has not passed, so it costs what has passed, not what is open (10,000 streams each waiting on a read).

A loop that waits many times (a relayed stream, each read of it) keeps one :class:`Idle` open across
its waits instead: ``renew()`` before each wait counts ``seconds`` from then, ``pause()`` after it
stops the count (while the loop does its own work, or its consumer writes). Renewing is two stores;
the idle deadlines are looked at, all of them, once a second (``IDLE_LOOK``), or four times in the
shortest one's ``seconds`` if that is sooner: one fires up to that late (a read timeout's seconds are
minutes, as a rule).

    with gateway.deadlines.idle(seconds) as idle:
        while ...:
            idle.renew()
            data = await read()                # TimeoutError if it took ``seconds``
            idle.pause()

One :class:`Deadlines` serves one event loop at a time (the gateway's); it follows the loop it is
used on.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

TICK = 0.05  # seconds between looks at the open deadlines
IDLE_LOOK = 1.0  # seconds between looks at the idle ones
PAUSED = float("inf")


class Deadlines:
    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self._open: dict[float, dict[Deadline, None]] = {}  # by seconds, each in the order they pass
        self._idle: dict[Idle, None] = {}
        self._idle_look = 0.0  # when the idle ones are looked at next
        self._idle_every = IDLE_LOOK  # how often
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def after(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` from when its ``with`` block is entered, for the task entering it."""
        return Deadline(self, seconds)

    def idle(self, seconds: float) -> Idle:
        """A deadline kept open across many waits, each ``seconds`` from its ``renew()``."""
        return Idle(self, seconds)

    def _open_one(self, deadline: Deadline, loop: asyncio.AbstractEventLoop) -> None:
        self._follow(loop)
        same = self._open.get(deadline.seconds)
        if same is None:
            same = self._open[deadline.seconds] = {}
        same[deadline] = None
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.tick, self._sweep)

    def _open_idle(self, idle: Idle, loop: asyncio.AbstractEventLoop) -> None:
        self._follow(loop)
        self._idle[idle] = None
        if idle.seconds < 4 * self._idle_every:
            self._idle_every = max(idle.seconds / 4, self.tick)
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.tick, self._sweep)

    def _follow(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # a new loop (tests run several, one after the other)
            self._open.clear()
            self._idle.clear()
            self._loop, self._timer = loop, None

    def _sweep(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for seconds, same in list(self._open.items()):
            passed = []
            for deadline in same:
                if deadline.when > now:
                    break
                passed.append(deadline)
            for deadline in passed:
                del same[deadline]
                deadline.expire()
            if not same:
                del self._open[seconds]
        if not self._idle:
            self._idle_every = IDLE_LOOK  # (the shortest has gone)
        elif now >= self._idle_look:
            self._idle_look = now + self._idle_every
            for idle in [d for d in self._idle if d.when <= now]:
                del self._idle[idle]
                idle.expire()
        self._timer = loop.call_at(now + self.tick, self._sweep) if self._open or self._idle else None


class Deadline:
    """One deadline (a ``with`` block in one task); see :class:`Deadlines`."""

    __slots__ = ("owner", "seconds", "when", "task", "cancelling", "expired")

    def __init__(self, owner: Deadlines, seconds: float) -> None:
        self.owner = owner
        self.seconds = seconds
        self.expired = False

    def __enter__(self) -> Deadline:
        loop = self._begin()
        self.when = loop.time() + self.seconds
        self.owner._open_one(self, loop)
        return self

    def _begin(self) -> asyncio.AbstractEventLoop:
        """Bind to the task entering the block; its loop."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be opened inside a task")
        self.task = task
        self.expired = False
        self.cancelling = task.cancelling()
        return task.get_loop()

    def _leave(self) -> None:
        """Off the owner's open deadlines (it has not passed)."""
        open_ = self.owner._open
        same = open_.get(self.seconds)
        if same is not None:
            same.pop(self, None)
            if not same:
                del open_[self.seconds]

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.expired:
            self._leave()
        elif self.task.uncancel() <= self.cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from exc


class Idle(Deadline):
    """A deadline open across many waits of one task (see :class:`Deadlines`); it counts only between
    a ``renew()`` and the next ``pause()``."""

    __slots__ = ("_time",)

    def __enter__(self) -> Idle:
        loop = self._begin()
        self.when = PAUSED
        self._time = loop.time
        self.owner._open_idle(self, loop)
        return self

    def renew(self) -> None:
        self.when = self._time() + self.seconds

    def pause(self) -> None:
        self.when = PAUSED

    def _leave(self) -> None:
        self.owner._idle.pop(self, None)
