"""The in-process rate limit backend: GCRA buckets in a dict, for one gateway process.

The event loop runs one ``take`` at a time and it never awaits, so every call's check-and-take is
atomic without a lock. Buckets whose TAT has passed are full again and are swept now and then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from core.types import Headers
from gateway.ratelimit import PERIOD, Backend, Bucket, BucketState, Plan, gcra, raw_headers

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
        self._swept(now)
        return ok, states

    def admit_now(self, plan: Plan, tokens: int) -> Headers | None:
        """The common case of ``take`` in plain arithmetic: if every bucket of ``plan`` has room for
        this call (1 request, ``tokens`` tokens), take from all and return the response's headers;
        else take nothing and return None (the caller's general path then refuses)."""
        now = self.clock()
        horizon = now + self.period  # a bucket has room if its TAT after this call is not beyond
        tats = self._tat
        new: list[float] = []
        for name, limit, interval, is_tokens in plan.buckets:
            cost = tokens if is_tokens else 1
            tat = tats.get(name, now)
            if tat < now:
                tat = now
            tat += cost * interval
            if tat > horizon or cost > limit:
                return None
            new.append(tat)
        tightest: list[tuple[bool, int, int, float]] = []  # of each kind (gcra's remaining and reset)
        for (name, limit, interval, is_tokens), tat in zip(plan.buckets, new, strict=True):
            tats[name] = tat
            remaining = int((horizon - tat) / interval + 1e-6)
            if not tightest or tightest[-1][0] != is_tokens:
                tightest.append((is_tokens, limit, remaining, tat - now))
            else:
                held = tightest[-1]
                if remaining < held[2] or (remaining == held[2] and tat - now > held[3]):
                    tightest[-1] = (is_tokens, limit, remaining, tat - now)
        self._swept(now)
        return raw_headers(tightest)

    def _swept(self, now: float) -> None:
        """Now and then, forget the buckets that are full again (their TAT has passed)."""
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self._until_sweep = SWEEP_EVERY
            tats = self._tat
            for name in [n for n, t in tats.items() if t <= now]:
                del tats[name]
