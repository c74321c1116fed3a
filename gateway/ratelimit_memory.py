"""The in-process rate limit backend: GCRA buckets in a dict, for one gateway process.

The event loop runs one ``take`` at a time and it never awaits, so every call's check-and-take is
atomic without a lock. Buckets whose TAT has passed are full again and are swept now and then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from core.types import Headers
from gateway.ratelimit import PERIOD, Backend, Bucket, BucketState, KeyBuckets, gcra, reset_bytes

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

    def admit_now(self, plan: KeyBuckets, tokens: int) -> Headers | None:
        """The common case of ``take`` in plain arithmetic: if every bucket of ``plan`` has room for
        this call (1 request, ``tokens`` tokens), take from all and return the response's headers (of
        each kind the tightest bucket: the least remaining, the later reset on a tie, as ``gcra``
        counts them); else take nothing and return None (the caller's general path then refuses)."""
        now = self.clock()
        horizon = now + self.period  # a bucket has room if its TAT after this call is not beyond
        tats = self._tat
        new: list[tuple[str, float]] = []
        out: Headers = []
        for is_tokens, names, buckets in plan.by_kind:
            cost = tokens if is_tokens else 1
            least, latest, limit_text = -1, 0.0, b""
            for name, limit, interval, text in buckets:
                tat = tats.get(name, now)
                if tat < now:
                    tat = now
                tat += cost * interval
                if tat > horizon or cost > limit:
                    return None
                new.append((name, tat))
                remaining = int((horizon - tat) / interval + 1e-6)
                if least < 0 or remaining < least or (remaining == least and tat > latest):
                    least, latest, limit_text = remaining, tat, text
            out += ((names[0], limit_text), (names[1], b"%d" % least), (names[2], reset_bytes(latest - now)))
        for name, tat in new:
            tats[name] = tat
        self._swept(now)
        return out

    def _swept(self, now: float) -> None:
        """Now and then, forget the buckets that are full again (their TAT has passed)."""
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self._until_sweep = SWEEP_EVERY
            tats = self._tat
            for name in [n for n, t in tats.items() if t <= now]:
                del tats[name]
