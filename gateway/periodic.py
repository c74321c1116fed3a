"""A background task that runs a coroutine function every ``interval`` seconds beside the calls (the
last-used times' writes, the alerts' checks and deliveries), and once more when it stops. A run that
fails is logged and the next one tries again: nothing on the call path waits for it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("router.periodic")


class Periodic:
    def __init__(
        self, name: str, interval: float, run: Callable[[], Awaitable[object]], final: bool = True
    ) -> None:
        self.name = name
        self.interval = interval
        self.run = run
        self.final = final  # run once more on stop (a flush of what was noted)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    def poke(self) -> None:
        """Run now rather than at the end of the interval."""
        self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self.final:
            await self._once()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            await self._once()

    async def _once(self) -> None:
        try:
            await self.run()
        except Exception as exc:
            log.warning("%s failed: %r (retried in %.0f s)", self.name, exc, self.interval)
