"""Calls in flight per key and per group: ``[limits] key_concurrent`` and ``group_concurrent`` (0 =
none; ``[limits.groups.<name>]`` overrides them for one group and its keys).

Rate limits bound how fast a key starts calls, not how many it holds open: without this, one key's
long streams could take every connection slot of the server (``[server] max_connections``) and
every other group's new connections would be refused. A call takes a place in its key's and its
group's count when it is admitted (with the rate limits, before anything is reserved or sent
upstream) and gives it back when it ends, whatever ends it: its answer or stream settled, the
caller gone, an upstream failure, a refusal after admission. A call over either limit is refused
with 429 ``concurrency_limit_exceeded`` and ``Retry-After: 1``; nothing is reserved for it. Both
checks are made together (one Redis round trip), so a call refused here has still used one of its
key's and group's requests per minute (a call the rate limits refuse takes nothing from them).

Only calls a caller waits on count: a batch line and a background response run on the gateway's own
runners, bounded by ``[jobs]`` and ``[responses]``, and never take a caller's place.

Two backends implement the count behind :class:`Backend`:

    gateway.concurrency           one process: counts in a dict (:class:`MemoryBackend`)
    gateway.concurrency_redis     replicas sharing one Redis: a sorted set per key and per group of
                                  the calls in flight, each with an expiry this replica renews while
                                  the call runs, so a dead replica's places free themselves

Redis unreachable: ``[limits] fail_open`` (the default) admits the call uncounted; otherwise it is
refused with 429 and ``Retry-After: 1``, as the rate limits do.
"""

from __future__ import annotations

import itertools
import secrets
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from billing.store import Principal
from core import metrics
from core.errors import RateLimited
from gateway.ratelimit import warn_unavailable

if TYPE_CHECKING:
    from core.config import LimitsSettings

_KINDS = ("key_concurrent", "group_concurrent")
_WHAT = {"key_concurrent": "this API key", "group_concurrent": "this key's group"}


class Place(NamedTuple):
    """One count a call takes a place in: its storage name, its limit, which one it is (``_KINDS``)."""

    name: str
    limit: int
    kind: str


class Backend(ABC):
    """Counts calls in flight: takes a place in every count of a call if each has room, else none."""

    namespace: str = ""

    @abstractmethod
    def enter(self, places: list[Place], member: str) -> Awaitable[int]:
        """-1 if the call took a place in each count; else the index of the first count that is full.
        A backend with a round trip sends it with the next one, whether or not this is awaited yet."""

    @abstractmethod
    def leave(self, places: list[Place], member: str) -> None:
        """Give the call's places back (at once, or with the next round trip: nothing waits for it)."""

    async def close(self) -> None:
        return None


class MemoryBackend(Backend):
    """One process: the event loop runs one ``enter`` at a time and it never awaits, so check-and-take
    is atomic without a lock."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    async def enter(self, places: list[Place], member: str) -> int:  # (runs when awaited)
        counts = self.counts
        for i, place in enumerate(places):
            if counts.get(place.name, 0) >= place.limit:
                return i
        for place in places:
            counts[place.name] = counts.get(place.name, 0) + 1
        return -1

    def leave(self, places: list[Place], member: str) -> None:
        counts = self.counts
        for place in places:
            left = counts.get(place.name, 0) - 1
            if left > 0:
                counts[place.name] = left
            else:
                counts.pop(place.name, None)


class Flight:
    """A call's places, given back once by :meth:`end` (``leave``); ``then``: what else ends with the call
    (the deployment's lease, billing/ledger.py ``Meter.on_finish``). Also a place in a group's fair share
    (gateway/fairshare.py)."""

    __slots__ = ("leave", "then", "ended")

    def __init__(self, leave: Callable[[], None]) -> None:
        self.leave = leave
        self.then: Callable[[], None] | None = None
        self.ended = False

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        try:
            if self.then is not None:
                self.then()
        finally:
            self.leave()


class InFlight:
    """The admission of :class:`gateway.pipeline.Pipeline` for calls in flight (with the rate limits)."""

    def __init__(self, settings: LimitsSettings, backend: Backend | None, name: str = "") -> None:
        """``backend``: where the counts are (gateway/backends.py ``in_flight``); None: no limit is set."""
        self.settings = settings
        self.enabled = configured(settings)
        assert backend is not None or not self.enabled, (
            "limits of calls in flight are set: they need a backend"
        )
        self.backend = backend
        self._members = itertools.count(1)
        self._name = name or f"{secrets.token_hex(4)}:"  # this replica's prefix of its calls' members (Redis)
        self._places: dict[int, list[Place]] = {}

    def limits(self, group: str) -> tuple[int, int]:
        """(key's, group's) limit for a group's keys; 0 = none."""
        s, own = self.settings, self.settings.groups.get(group)
        values = [getattr(s, k) for k in _KINDS]
        if own is not None:
            values = [v if (o := getattr(own, k)) is None else o for k, v in zip(_KINDS, values, strict=True)]
        return values[0], values[1]

    def places(self, principal: Principal) -> list[Place]:
        places = self._places.get(principal.key_id)
        if places is None:
            if len(self._places) > 100_000:
                self._places.clear()
            assert self.backend is not None
            base = f"{self.backend.namespace}{{g{principal.group_id}}}:"  # one hash tag per group (Redis Cluster)
            names = (f"{base}k{principal.key_id}:f", f"{base}g:f")
            places = [
                Place(name, limit, kind)
                for name, limit, kind in zip(names, self.limits(principal.group_name), _KINDS, strict=True)
                if limit
            ]
            self._places[principal.key_id] = places
        return places

    def enter(self, principal: Principal) -> Awaitable[Flight | None] | None:
        """Take the call's places, or raise 429, when awaited: the :class:`Flight` to end when the call
        ends (None if the backend could not be reached and ``fail_open`` admits). None at once when no
        limit applies to this key. With Redis the check is queued now, so the rate limits' check made
        before this is awaited goes in the same round trip (gateway/pipeline.py)."""
        places = self.places(principal)
        if not places:
            return None
        backend = self.backend
        assert backend is not None
        member = f"{self._name}{next(self._members)}"
        return self._entered(backend, places, member, backend.enter(places, member))

    async def _entered(
        self, backend: Backend, places: list[Place], member: str, entering: Awaitable[int]
    ) -> Flight | None:
        try:
            full = await entering
        except Exception as exc:
            metrics.ratelimit_backend_error()
            warn_unavailable(exc)
            if self.settings.fail_open:
                return None
            raise RateLimited(
                "Calls in flight cannot be counted right now; retry shortly.", headers={"Retry-After": "1"}
            ) from None
        if full < 0:
            return Flight(partial(backend.leave, places, member))
        place = places[full]
        metrics.rate_limited(place.kind)
        raise RateLimited(
            f"Too many requests in flight for {_WHAT[place.kind]}: limit {place.limit}. Send the next one when "
            "one of them has ended.",
            code="concurrency_limit_exceeded",
            headers={"Retry-After": "1", "retry-after-ms": "1000"},
        )

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()


def configured(settings: LimitsSettings) -> bool:
    """Whether any limit of calls in flight is set (for every group or for one)."""
    return any(getattr(settings, k) for k in _KINDS) or any(
        getattr(g, k) for g in settings.groups.values() for k in _KINDS
    )
