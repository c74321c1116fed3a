"""The in-process rate limit backend: GCRA buckets in a dict, for one gateway process.

The event loop runs one ``take`` at a time and it never awaits, so every call's check-and-take is
atomic without a lock. Buckets whose TAT has passed are full again and are swept now and then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from router.ratelimit import PERIOD, Backend, Bucket, BucketState, gcra

SWEEP_EVERY = 4096  # takes between sweeps of full (expired) buckets


class MemoryBackend(Backend):
    namespace = ""

    def __init__(self, clock: Callable[[], float] = time.monotonic, period: float = PERIOD) -> None:
        self.clock = clock
        self.period = period
        self._tat: dict[str, float] = {}
        self._until_sweep = SWEEP_EVERY

    async def take(self, buckets: Sequence[Bucket]) -> tuple[bool, list[BucketState]]:
        return self.take_now(buckets)

    def take_now(self, buckets: Sequence[Bucket]) -> tuple[bool, list[BucketState]]:
        now = self.clock()
        tats = self._tat
        ok = True
        states: list[BucketState] = []
        new: list[float] = []
        for bucket in buckets:
            room, tat, state = gcra(tats.get(bucket.name, now), now, bucket.limit, bucket.cost, self.period)
            ok = ok and room
            new.append(tat)
            states.append(state)
        if ok:
            for bucket, tat in zip(buckets, new, strict=True):
                tats[bucket.name] = tat
        else:  # nothing was taken: report every bucket as it stands
            states = [
                s if s.retry_after else gcra(tats.get(b.name, now), now, b.limit, 0, self.period)[2]
                for b, s in zip(buckets, states, strict=True)
            ]
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self._until_sweep = SWEEP_EVERY
            for name in [n for n, t in tats.items() if t <= now]:
                del tats[name]
        return ok, states
