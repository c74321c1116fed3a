"""What routing knows of each deployment, and the one atomic step that puts a call on one.

Per deployment: its calls in flight and its RPM/TPM ceilings as GCRA buckets (the rate limits'
algorithm, gateway/ratelimit.py). Per deployment and model: how long it rests (after a 429: its
Retry-After; providers limit each model apart, and an Azure deployment is one model) and how fast
it answers (moving averages: models differ): streams' time to first byte, non-stream calls' seconds
per output token. Two backends implement :class:`UpstreamState`:

    MemoryState                        one process: plain attributes on the event loop
    gateway.upstream_state_redis       several replicas sharing one Redis: one Lua script per call

``acquire(order, model, tokens)`` walks ``order`` and puts the call on the first deployment that
does not rest for ``model`` and has room under its ceilings (taking one request and ``tokens`` from its buckets,
counting it in flight), atomically; or answers how long until one could take it. ``release`` ends
the call's hold, with what it taught: its latency (of its kind), and a cooldown if it was refused. It never waits:
the Redis backend sends it with the next round trip.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from core import metrics
from core.deployments import Deployment
from gateway.ratelimit import PERIOD, gcra
from gateway.routing import IDLE, Load


class Lease:
    """One call's hold on a deployment, from ``acquire`` to ``release`` (``end``: by the state that
    gave it, with the latency the call measured: a stream's time to first byte; a non-stream call's
    time to its answer over its ``output`` tokens, once the pipeline has read them)."""

    __slots__ = (
        "deployment",
        "model",
        "owner",
        "token",
        "opened_at",
        "latency",
        "released",
        "stream",
        "output",
    )

    def __init__(self, deployment: Deployment, model: str, owner: UpstreamState, token: str = "") -> None:
        self.deployment = deployment
        self.model = model  # the canonical id of the model called (rests and latencies are per model)
        self.owner = owner
        self.token = token  # the call's name in the shared in-flight set (Redis)
        self.opened_at = time.monotonic()
        self.latency: float | None = None  # seconds from acquire to the upstream's answer
        self.released = False
        self.stream = True  # the call's kind: which of the deployment's averages its latency joins
        self.output: int | None = None  # a non-stream call's output tokens, once known
        metrics.deployment_flight(deployment.prefix, deployment.name, 1)

    def end(self, *_: object) -> None:
        """The call is over (any arguments are ignored: it may be a callback's)."""
        if self.stream:
            self.owner.release(self, self.latency)
        elif self.latency is not None and self.output is not None:  # (an embeddings call: its whole time)
            self.owner.release(self, per_token=self.latency / max(self.output, 1))
        else:
            self.owner.release(self)


class UpstreamState(ABC):
    shared = False  # the state is every replica's (Redis), not this process's alone

    @abstractmethod
    def load(self, dep: Deployment, model: str) -> Load:
        """What is known now of ``dep``'s load, serving ``model`` (no I/O)."""

    @abstractmethod
    def resting(self, dep: Deployment) -> dict[str, float]:
        """The models ``dep`` rests for, and the seconds left, as far as this replica knows (no I/O)."""

    @abstractmethod
    async def acquire(self, order: Sequence[Deployment], model: str, tokens: int) -> Lease | float:
        """A lease on the first deployment of ``order`` that can take a call of ``model`` now, or the
        seconds until the earliest could (``math.inf``: none ever could, the call exceeds every
        ceiling)."""

    def release(
        self,
        lease: Lease,
        latency: float | None = None,
        cooldown: float = 0.0,
        per_token: float | None = None,
    ) -> None:
        """The call is over: out of flight, ``latency`` (a stream's seconds to first byte) or
        ``per_token`` (a non-stream call's seconds per output token) into its average, and
        ``cooldown`` seconds of rest for the deployment and model if it was refused. Idempotent,
        never waits."""
        if lease.owner is not self:  # given by another state (Redis's local stand-in)
            lease.owner.release(lease, latency, cooldown, per_token)
            return
        if lease.released:
            return
        lease.released = True
        metrics.deployment_flight(lease.deployment.prefix, lease.deployment.name, -1)
        self._release(lease, latency, cooldown, per_token)

    @abstractmethod
    def _release(
        self, lease: Lease, latency: float | None, cooldown: float, per_token: float | None
    ) -> None: ...

    async def close(self) -> None:
        return None


class _Dep:
    __slots__ = ("in_flight", "rpm_tat", "tpm_tat", "rest_until", "latency", "per_token")

    def __init__(self) -> None:
        self.in_flight = 0
        self.rpm_tat = 0.0
        self.tpm_tat = 0.0
        self.rest_until: dict[str, float] = {}  # model -> when its rest ends
        self.latency: dict[str, float] = {}  # model -> streams' seconds to first byte, moving average
        self.per_token: dict[str, float] = {}  # model -> non-stream calls' seconds per output token


def room(
    dep: Deployment, rpm_tat: float, tpm_tat: float, now: float, tokens: int
) -> tuple[float, float, float]:
    """(wait, new rpm TAT, new tpm TAT): ``wait`` 0 if both ceilings have room for the call."""
    wait = 0.0
    if dep.rpm:
        ok, rpm_tat, state = gcra(max(rpm_tat, now), now, dep.rpm, 1)
        wait = max(wait, state.retry_after)
    if dep.tpm:
        ok, tpm_tat, state = gcra(max(tpm_tat, now), now, dep.tpm, tokens)
        wait = max(wait, state.retry_after)
    return wait, rpm_tat, tpm_tat


def headroom(dep: Deployment, rpm_tat: float, tpm_tat: float, now: float) -> float:
    """The least unused fraction of ``dep``'s ceilings (1.0 without any)."""
    left = 1.0
    if dep.rpm:
        left = min(left, 1.0 - max(rpm_tat - now, 0.0) / PERIOD)
    if dep.tpm:
        left = min(left, 1.0 - max(tpm_tat - now, 0.0) / PERIOD)
    return max(left, 0.0)


class MemoryState(UpstreamState):
    """One process's state. The event loop runs one ``acquire`` at a time and it never awaits, so it
    is atomic without a lock."""

    def __init__(self, alpha: float = 0.3, clock: Callable[[], float] = time.monotonic) -> None:
        self.alpha = alpha  # a new latency sample's weight in the average
        self.clock = clock
        self._deps: dict[str, _Dep] = {}

    def _of(self, dep: Deployment) -> _Dep:
        state = self._deps.get(dep.key)
        if state is None:
            state = self._deps[dep.key] = _Dep()
        return state

    def load(self, dep: Deployment, model: str) -> Load:
        state = self._deps.get(dep.key)
        if state is None:
            return IDLE
        return Load(
            state.in_flight,
            state.latency.get(model),
            headroom(dep, state.rpm_tat, state.tpm_tat, self.clock()),
            state.per_token.get(model),
        )

    def resting(self, dep: Deployment) -> dict[str, float]:
        state = self._deps.get(dep.key)
        if state is None or not state.rest_until:
            return {}
        now = self.clock()
        return {model: until - now for model, until in state.rest_until.items() if until > now}

    async def acquire(self, order: Sequence[Deployment], model: str, tokens: int) -> Lease | float:
        return self.acquire_now(order, model, tokens)

    def acquire_now(self, order: Sequence[Deployment], model: str, tokens: int) -> Lease | float:
        now = self.clock()
        soonest = math.inf
        for dep in order:
            state = self._of(dep)
            if state.rest_until:
                until = state.rest_until.get(model, 0.0)
                if until > now:
                    soonest = min(soonest, until - now)
                    continue
            if dep.rpm or dep.tpm:
                wait, rpm_tat, tpm_tat = room(dep, state.rpm_tat, state.tpm_tat, now, tokens)
                if wait:
                    soonest = min(soonest, wait)
                    continue
                state.rpm_tat, state.tpm_tat = rpm_tat, tpm_tat
            state.in_flight += 1
            return Lease(dep, model, self)
        return soonest

    def _release(self, lease: Lease, latency: float | None, cooldown: float, per_token: float | None) -> None:
        state = self._of(lease.deployment)
        state.in_flight -= 1
        model = lease.model
        for sample, averages in ((latency, state.latency), (per_token, state.per_token)):
            if sample is not None:
                old = averages.get(model)
                averages[model] = sample if old is None else old + self.alpha * (sample - old)
        if cooldown > 0:
            now = self.clock()
            state.rest_until = {m: t for m, t in state.rest_until.items() if t > now}  # the ended ones go
            state.rest_until[model] = max(state.rest_until.get(model, 0.0), now + cooldown)
