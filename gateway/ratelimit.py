"""Rate limits per key and per group: requests per minute (RPM) and tokens per minute (TPM).

A call is admitted once, before anything is reserved or sent upstream, against up to four buckets:
the key's RPM and TPM and its group's RPM and TPM (``[limits]`` in the settings; ``0`` = unlimited;
``[limits.groups.<name>]`` overrides them for one group and its keys). Its tokens are the call's
worst case at admission — the prompt's upper bound plus ``max_tokens`` (or the model's output
ceiling) — the way OpenAI counts ``max_tokens`` against TPM; they are not refunded after the call.

Each bucket is a GCRA (generic cell rate algorithm): one stored number per bucket, the theoretical
arrival time (TAT); a bucket of ``limit`` per minute refills continuously at ``limit / 60`` per
second and holds at most ``limit``. A call passes only if every bucket has room, and then takes from
all of them — all or nothing, atomically. Two backends implement that behind :class:`Backend`:

    gateway.ratelimit_memory   one process (a dict of TATs on the event loop)
    gateway.ratelimit_redis    several replicas sharing one Redis: one Lua script, one round trip

Refused: 429 ``rate_limit_exceeded`` with ``Retry-After`` (and ``retry-after-ms``); admitted: the
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers of the tightest bucket of each kind.

Every call pays for this, so the common case is lean: a key's buckets are resolved once (a
:class:`KeyBuckets`), the memory backend admits a call that fits with plain arithmetic (``admit_now``), and
the headers are returned as raw ASGI header pairs. A refusal, and every Redis check, takes the
general path (:class:`Bucket` → ``Backend.take`` → :class:`BucketState`).
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from billing.pricing import input_ceiling, output_ceiling
from billing.store import Principal
from core import metrics
from core.errors import RateLimited
from core.types import Headers

if TYPE_CHECKING:
    from core.catalog import Model
    from core.config import LimitsSettings
    from core.wire import ChatRequest

PERIOD = 60.0  # seconds: the limits are per minute
NEVER = math.inf  # retry_after of a call larger than the bucket itself

log = logging.getLogger("gateway.ratelimit")


class Bucket(NamedTuple):
    name: str  # storage key (the backend's namespace included)
    limit: int  # per PERIOD
    cost: int  # what this call takes


class BucketState(NamedTuple):
    remaining: int  # what is left after this call (or now, when the call was refused)
    reset: float  # seconds until the bucket is full again
    retry_after: float  # 0 when this bucket has room; NEVER when the cost exceeds the limit


def gcra(
    tat: float, now: float, limit: int, cost: int, period: float = PERIOD
) -> tuple[bool, float, BucketState]:
    """One bucket: (has room, TAT after taking ``cost``, state). The caller stores the new TAT only if
    every bucket of the call has room. Mirrored in Lua by :mod:`gateway.ratelimit_redis`."""
    interval = period / limit
    base = tat if tat > now else now
    new_tat = base + cost * interval
    if cost > limit:
        return False, base, BucketState(_left(now, base, interval, period), base - now, NEVER)
    allow_at = new_tat - period
    if allow_at > now:
        return False, base, BucketState(_left(now, base, interval, period), base - now, allow_at - now)
    return True, new_tat, BucketState(_left(now, new_tat, interval, period), new_tat - now, 0.0)


def _left(now: float, tat: float, interval: float, period: float) -> int:
    return max(int(math.floor((now + period - tat) / interval + 1e-6)), 0)


class Backend(ABC):
    """Takes ``cost`` from every bucket if all have room, else from none, atomically."""

    namespace: str = ""  # prefix of the bucket names
    pipe: Any = None  # a shared backend's script pipe, which the calls-in-flight counts may share (gateway/backends.py)

    @abstractmethod
    async def take(self, buckets: Sequence[Bucket]) -> tuple[bool, list[BucketState]]: ...

    def admit_now(self, plan: KeyBuckets, tokens: int) -> Headers | None:
        """The common case of :meth:`take` without awaiting, where the backend can (this process's
        memory): if every bucket has room, take from all and return the headers; None: go the general
        way (a shared backend always does)."""
        return None

    async def close(self) -> None:
        return None


class KeyBuckets:
    """One key's buckets whose limit is not 0, requests before tokens: (storage name, limit, seconds
    per unit, counts tokens), and their kinds (``_KINDS``). ``by_kind``: the same buckets for the
    admission's arithmetic, by what they count (requests, then tokens): (counts tokens, the header
    names of that kind, its buckets as (storage name, limit, seconds per unit, limit as header bytes))."""

    __slots__ = ("buckets", "kinds", "tokens", "by_kind")

    def __init__(self, buckets: list[tuple[str, int, bool]], kinds: list[str]) -> None:
        self.buckets = [(name, limit, PERIOD / limit, is_tokens) for name, limit, is_tokens in buckets]
        self.kinds = kinds
        self.tokens = any(is_tokens for _, _, is_tokens in buckets)
        self.by_kind = [
            (
                counts,
                _NAMES[counts],
                [(n, limit, step, b"%d" % limit) for n, limit, step, t in self.buckets if t == counts],
            )
            for counts in (False, True)
            if any(t == counts for *_, t in self.buckets)
        ]


_NAMES = {  # (limit, remaining, reset) header names by counts-tokens
    False: (b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests", b"x-ratelimit-reset-requests"),
    True: (b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens"),
}


def raw_headers(tightest: list[tuple[bool, int, int, float]]) -> Headers:
    """The headers of (counts tokens, limit, remaining, reset seconds) of each kind's tightest bucket."""
    out: Headers = []
    for is_tokens, limit, remaining, reset in tightest:
        names = _NAMES[is_tokens]
        out += ((names[0], b"%d" % limit), (names[1], b"%d" % remaining), (names[2], reset_bytes(reset)))
    return out


class Quota(NamedTuple):
    key_rpm: int
    key_tpm: int
    group_rpm: int
    group_tpm: int


_KINDS = ("key_rpm", "key_tpm", "group_rpm", "group_tpm")  # Quota's fields, in bucket order
_WHAT = {
    "key_rpm": ("requests per minute (RPM)", "this API key"),
    "key_tpm": ("tokens per minute (TPM)", "this API key"),
    "group_rpm": ("requests per minute (RPM)", "this key's group"),
    "group_tpm": ("tokens per minute (TPM)", "this key's group"),
}


def reset_bytes(seconds: float) -> bytes:
    """:func:`duration` as header bytes; the common case (under a second) without a string."""
    if 0 < seconds < 1:
        return b"%dms" % max(math.ceil(seconds * 1000), 1)
    return duration(seconds).encode()


def duration(seconds: float) -> str:
    """OpenAI's (Go's) duration style: ``20ms``, ``1s``, ``1.5s``, ``6m0s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 1)}ms"
    seconds = math.ceil(seconds * 1000) / 1000
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{int(hours)}h{int(minutes)}m{text}"
    return f"{int(minutes)}m{text}" if minutes else text


class RateLimiter:
    """The admission check of :class:`gateway.pipeline.Pipeline` (limits, then the reservation: docs/architecture.md, the path of one call)."""

    def __init__(self, settings: LimitsSettings, backend: Backend | None) -> None:
        """``backend``: where the buckets are (gateway/backends.py ``rate_limits``); None: no limit is set."""
        self.settings = settings
        self.enabled = configured(settings)
        assert backend is not None or not self.enabled, "rate limits are set: they need a backend"
        self.backend = backend
        self._quotas: dict[str, Quota] = {}
        self._plans: dict[int, KeyBuckets] = {}

    def quota(self, group: str) -> Quota:
        quota = self._quotas.get(group)
        if quota is None:
            s, own = self.settings, self.settings.groups.get(group)
            values = [getattr(s, k) for k in _KINDS]
            if own is not None:
                values = [
                    v if (o := getattr(own, k)) is None else o for k, v in zip(_KINDS, values, strict=True)
                ]
            quota = self._quotas[group] = Quota(*values)
        return quota

    def plan(self, principal: Principal) -> KeyBuckets:
        plan = self._plans.get(principal.key_id)
        if plan is None:
            if len(self._plans) > 100_000:
                self._plans.clear()
            assert self.backend is not None
            # one hash tag per group: a Redis Cluster keeps a key's and its group's buckets together
            base = f"{self.backend.namespace}{{g{principal.group_id}}}:"
            k = f"{base}k{principal.key_id}:"
            names = (k + "r", k + "t", base + "g:r", base + "g:t")
            quota = self.quota(principal.group_name)
            chosen = [i for i in (0, 2, 1, 3) if quota[i]]  # requests, then tokens; the key's first
            plan = KeyBuckets([(names[i], quota[i], i % 2 == 1) for i in chosen], [_KINDS[i] for i in chosen])
            self._plans[principal.key_id] = plan
        return plan

    async def admit(
        self, principal: Principal, model: Model, body_size: int, req: ChatRequest
    ) -> Headers | None:
        """Admit one call or raise 429; returns the response's ``x-ratelimit-*`` headers (None when
        no limit applies, or ``[limits] headers`` is off: a refusal carries them all the same)."""
        if not self.enabled:
            return None
        plan = self.plan(principal)
        if not plan.buckets:
            return None
        tokens = input_ceiling(body_size, req) + output_ceiling(model, req) if plan.tokens else 0
        assert self.backend is not None
        headers = self.backend.admit_now(plan, tokens)
        if headers is not None:
            return headers if self.settings.headers else None
        buckets = [
            Bucket(name, limit, tokens if is_tokens else 1) for name, limit, _, is_tokens in plan.buckets
        ]
        kinds = plan.kinds
        try:
            ok, states = await self.backend.take(buckets)
        except Exception as exc:  # the shared store is down: admit rather than refuse every call
            metrics.ratelimit_backend_error()
            warn_unavailable(exc)
            if self.settings.fail_open:
                return None
            raise RateLimited(
                "Rate limits cannot be checked right now; retry shortly.", headers={"Retry-After": "1"}
            ) from None
        tightest = _tightest(buckets, kinds, states)
        if ok:
            return raw_headers(tightest) if self.settings.headers else None
        raise self._refusal(buckets, kinds, states, _headers(tightest))

    def _refusal(
        self, buckets: list[Bucket], kinds: list[str], states: list[BucketState], headers: dict[str, str]
    ) -> RateLimited:
        worst = max(range(len(states)), key=lambda i: states[i].retry_after)
        bucket, kind, state = buckets[worst], kinds[worst], states[worst]
        metrics.rate_limited(kind)
        what, whose = _WHAT[kind]
        if state.retry_after == NEVER:  # no wait cures it: no Retry-After, and the SDKs are told not to retry
            return RateLimited(
                f"Request too large for {whose}'s {what}: limit {bucket.limit}, requested {bucket.cost}. "
                "Lower max_tokens or send a shorter prompt.",
                headers=headers,
                final=True,
            )
        wait = state.retry_after
        headers["Retry-After"] = str(max(math.ceil(wait), 1))
        headers["retry-after-ms"] = str(max(math.ceil(wait * 1000), 1))
        return RateLimited(
            f"Rate limit reached for {whose}'s {what}: limit {bucket.limit}, remaining {state.remaining}, "
            f"requested {bucket.cost}. Please try again in {duration(wait)}.",
            headers=headers,
        )

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()


def _tightest(
    buckets: list[Bucket], kinds: list[str], states: list[BucketState]
) -> list[tuple[bool, int, int, float]]:
    """(counts tokens, limit, remaining, reset) of the tightest bucket of each kind (requests, then
    tokens): the least remaining, the later reset on a tie."""
    out = []
    for tokens in (False, True):
        best = -1
        for i, kind in enumerate(kinds):
            if kind.endswith("tpm") == tokens and (
                best < 0
                or states[i].remaining < states[best].remaining
                or (states[i].remaining == states[best].remaining and states[i].reset > states[best].reset)
            ):
                best = i
        if best >= 0:
            out.append((tokens, buckets[best].limit, states[best].remaining, states[best].reset))
    return out


def _headers(tightest: list[tuple[bool, int, int, float]]) -> dict[str, str]:
    """:func:`raw_headers` as a dict (a refusal's error response)."""
    return {name.decode(): value.decode() for name, value in raw_headers(tightest)}


_last_warning = 0.0


def warn_unavailable(exc: Exception) -> None:
    """Log (at most every 10 s) that the shared backend of the limits cannot be reached."""
    global _last_warning
    now = time.monotonic()
    if now - _last_warning > 10:
        _last_warning = now
        log.warning(
            "rate limit backend unavailable (%s: %s); calls are admitted unchecked", type(exc).__name__, exc
        )


def configured(settings: LimitsSettings) -> bool:
    """Whether any rate limit is set (for every group or for one)."""
    return any(getattr(settings, k) for k in _KINDS) or any(
        getattr(g, k) for g in settings.groups.values() for k in _KINDS
    )
