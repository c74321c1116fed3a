"""Each group's fair share of one gateway process's calls in flight, when no limit is configured
(``[limits] fair_share_calls``; docs/operations.md, "Tenant isolation").

One group's burst (a thousand slow streams at once) takes the event loop's time from every other
group: their calls wait behind its chunks. The limits of calls in flight (gateway/concurrency.py) stop
that, but only where an operator set them. So, by default, once another group has called within the
last ``RECENT_SECONDS``, no group holds more than ``cap`` calls in flight (``capacity`` less a quarter
of it: the reserve kept for the groups that may arrive), even while the others are idle: a burst that
lands then is refused past it, not admitted whole. Once this process holds ``cap`` calls, a call is
also refused if its group already holds its share: ``cap`` over the number of groups active now (a
call in flight, or one started within the last second). A group holding nothing is never refused, and
a group that nobody else has called beside for ``RECENT_SECONDS`` holds as many as it likes (a
gateway with one tenant). A refusal is 429 ``concurrency_limit_exceeded`` with ``Retry-After: 1``.

Counts are this process's (each replica protects its own event loop). Groups with a
``group_concurrent`` of their own, and every group when ``[limits] group_concurrent`` is set, are
left to those limits. A batch line or a background response takes no place (their runners are bounded).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

from core import metrics
from core.errors import RateLimited
from gateway.concurrency import Flight

if TYPE_CHECKING:
    from core.config import LimitsSettings

ACTIVE_SECONDS = 1.0  # a group that started a call this recently is active
RECENT_SECONDS = 600.0  # a group that started one this recently may arrive again: a reserve is kept for it
UNBOUNDED = 1 << 62


def group_cap(capacity: int) -> int:
    """The most calls in flight one group may hold in a process of ``capacity``: the rest is the reserve
    kept for the others (a quarter, at least one place)."""
    return max(capacity - max(capacity // 4, 1), 1)


class FairShare:
    def __init__(self, settings: LimitsSettings) -> None:
        self.capacity = 0  # calls in flight the shares divide; 0: no share applies
        self.cap = 0  # the most one group holds (group_cap)
        self.exempt: frozenset[str] = frozenset()  # groups with a group_concurrent of their own
        self.configure(settings)
        self.total = 0
        self.counts: dict[int, int] = {}  # group id -> its calls in flight
        self.started: dict[int, float] = {}  # group id -> when it last started one (monotonic)
        self.refused = 0

    def configure(self, settings: LimitsSettings) -> None:
        """At the start and at a reload (the counts of the calls in flight are kept)."""
        self.capacity = 0 if settings.group_concurrent else settings.fair_share_calls
        self.cap = group_cap(self.capacity)
        self.exempt = frozenset(name for name, own in settings.groups.items() if own.group_concurrent)

    def enter(self, group_id: int, group: str) -> Flight | None:
        """The call's place, or None (no share applies); raises 429 if its group holds its share."""
        if not self.capacity or group in self.exempt:
            return None
        now = time.monotonic()
        self.started[group_id] = now
        held = self.counts.get(group_id, 0)
        if held and (held >= self.cap or self.total >= self.cap) and held >= self.limit(group_id, now):
            self.refused += 1
            metrics.rate_limited("fair_share")
            raise RateLimited(
                f"This gateway is busy and this key's group holds its share of the calls in flight ({held}). "
                "Send the next one when one of them has ended.",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": "1", "retry-after-ms": "1000"},
            )
        self.counts[group_id] = held + 1
        self.total += 1
        return Flight(partial(self.leave, group_id))  # its place, given back once by ``end``

    def limit(self, group_id: int, now: float) -> int:
        """The most calls in flight ``group_id`` may hold now: ``cap`` over the groups active now once
        the process holds ``cap``, else ``cap``; no bound while no other group called lately."""
        started = self.started
        if len(started) > 64:  # (forget the groups gone quiet)
            for gone in [
                g for g, at in started.items() if now - at > RECENT_SECONDS and g not in self.counts
            ]:
                del started[gone]
        if not any(g != group_id and now - at <= RECENT_SECONDS for g, at in started.items()):
            return UNBOUNDED
        active = sum(1 for g, at in started.items() if now - at <= ACTIVE_SECONDS or g in self.counts)
        if active < 2 or self.total < self.cap:
            return self.cap
        return max(self.cap // active, 1)

    def leave(self, group_id: int) -> None:
        self.total -= 1
        left = self.counts[group_id] - 1
        if left:
            self.counts[group_id] = left
        else:
            del self.counts[group_id]
