"""Keeping calls alive when an upstream stumbles: moving to another deployment of the provider,
retrying, and a circuit breaker per deployment.

    open_upstream  sends a call to one of its provider's deployments (gateway/dispatch.py orders
                them), moving to the next at once on a failure a fallback model might not have,
                before any retry or fallback model; retrying what is worth retrying once every
                deployment was tried; and keeps each deployment's circuit breaker and rest informed.
                A deployment's 429 rests it, for that model, for its Retry-After (``[routing]
                cooldown`` without one), as does any failure that says when to come back; when every
                deployment rests or is at its RPM/TPM ceiling the call waits for the first to come back
                (a retry) or is a 429 with that Retry-After. A model one deployment alone serves does
                not rest: the retries honour the upstream's Retry-After, as they always did. It does
                the I/O (acquire, the breakers, send, sleep); what comes next after each outcome, and
                which failures are retried (``retryable``), failed over (``failover``) and waited for
                how long (``backoff``), gateway/attempts_plan.py decides without I/O.
    breaker     after ``threshold`` failed calls in a row (no call answered between them) a deployment is
                skipped for ``cooldown`` seconds, then one probe call is let through: success closes it,
                failure opens it again. A call counts once however often it was tried. Only the
                provider's own failures count (5xx, connection failures, timeouts, its refusal of our
                credentials or credit); what it answers about one request's content (a 4xx: a bad
                request, a context overflow, a content-policy refusal) never does. A probe that ends
                any other way (the caller's 402 or 4xx, the caller hanging up, an upstream 4xx or 429)
                is released: the next call probes again. A probe that is never released (a bug)
                expires after ``probe_timeout`` seconds.
                One tenant cannot open it for the others: a provider can fail on what a call carries (a
                500 on one input, a timeout on a long answer), so failures that one group's calls
                alone made open the circuit for that group only, and the other groups' calls go
                through as if it were closed (the first to succeed closes it). Failures from more than
                one group open it for every group, except a group whose own last call here was answered
                less than ``cooldown`` ago: the provider works for it, so its calls still go, and its
                success closes the circuit (its failure counts like any other). /readyz says why each
                circuit that is not closed is open (``Breakers.reasons``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import aiohttp

from adapters.base import UpstreamRequest
from core import metrics
from core.catalog import Model
from core.deployments import Deployment
from core.errors import GatewayError, RateLimited, UpstreamNotFound, UpstreamTimeout, UpstreamUnavailable
from gateway.attempts_plan import FAILOVER, RETRY, Attempts, Step
from gateway.attempts_plan import backoff as backoff  # (re-exported: the jobs' retries, the tests)
from gateway.attempts_plan import breaker_failure as breaker_failure
from gateway.attempts_plan import failover as failover
from gateway.attempts_plan import retryable as retryable
from gateway.routing import Ask
from gateway.tracing import current as traced
from gateway.upstream_state import Lease

if TYPE_CHECKING:
    from adapters.transport import ObservedTransport
    from billing.store import Store
    from core.config import Settings
    from core.deadlines import Deadlines
    from gateway.dispatch import Dispatcher
    from gateway.tracing import Tracing


class Services(Protocol):
    """What :func:`open_upstream` reads of the gateway (:class:`gateway.state.Gateway`): the
    deployments' order and rests, the breakers, the transport and the call path's timeouts."""

    @property
    def settings(self) -> Settings: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def breakers(self) -> Breakers: ...

    @property
    def transport(self) -> ObservedTransport: ...

    @property
    def deadlines(self) -> Deadlines: ...

    @property
    def store(self) -> Store: ...

    @property
    def tracing(self) -> Tracing | None: ...


class Opened(NamedTuple):
    response: aiohttp.ClientResponse
    lease: Lease  # released when the call ends (its latency into the deployment's average)


UNSERVED = 60.0  # seconds a deployment that answered 404 for a model is left out of that model's calls


REFUSED = -1  # Breaker.allow: the circuit is open (or its one probe is in flight)
PASS = 0  # Breaker.allow: closed, the call goes through; a positive number is a probe's ticket
GOOD_KEPT = 4096  # groups whose last success a breaker remembers before it forgets the stale ones


class Breaker:
    """One deployment's circuit (the module's docstring says when it opens, for whom, and how it closes)."""

    __slots__ = (
        "threshold",
        "cooldown",
        "probe_timeout",
        "failures",
        "open_until",
        "probe",
        "probe_until",
        "groups",
        "good",
        "error",
        "opened_at",
        "_tickets",
    )

    def __init__(self, threshold: int, cooldown: float, probe_timeout: float = 300.0) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        # failed calls since the last success (a call counts once however often it was tried)
        self.failures = 0
        self.open_until = 0.0
        self.probe = 0  # the ticket of the probe in flight (half-open), 0 if none
        self.probe_until = 0.0
        self.groups: set[int] = set()  # the groups whose calls failed since the last success
        self.good: dict[int, float] = {}  # group -> when its last call here succeeded (if none failed since)
        self.error = ""  # the last failure's code, for the operator (/readyz)
        self.opened_at = 0.0
        self._tickets = 0

    def allow(self, group: int, now: float | None = None) -> int:
        """``PASS``, ``REFUSED``, or a probe's ticket (> 0), which the caller must hand back to
        :meth:`release` however the call ends (``success``/``failure`` also end the probe). A call of
        ``group`` passes while another group's failures alone hold the circuit open, and while its own
        last call here succeeded less than ``cooldown`` ago (the provider answered it lately)."""
        if self.failures < self.threshold or not self._blames(group):
            return PASS
        now = time.monotonic() if now is None else now
        if self.good.get(group, -math.inf) > now - self.cooldown:
            return PASS
        if now < self.open_until or (self.probe and now < self.probe_until):
            return REFUSED
        self._tickets += 1  # half-open: this call is the probe (an expired probe is replaced)
        self.probe = self._tickets
        self.probe_until = now + self.probe_timeout
        return self.probe

    def release(self, ticket: int) -> None:
        """The call holding ``ticket`` is over; if it was still the probe (no outcome was reported:
        it ended for a reason that says nothing about the provider), the next call probes again."""
        if ticket > 0 and ticket == self.probe:
            self.probe = 0

    def success(self, group: int, now: float) -> None:
        """A call of ``group`` was answered: the circuit closes for every group."""
        good = self.good
        if len(good) >= GOOD_KEPT and group not in good:
            for stale in [g for g, at in good.items() if at <= now - self.cooldown]:
                del good[stale]
            if len(good) >= GOOD_KEPT:
                good.clear()
        good[group] = now
        if self.failures:
            self.failures = 0
            self.probe = 0
            self.groups.clear()

    def failure(self, group: int, now: float | None = None, error: str = "") -> None:
        """A call of ``group`` failed for a reason that is the provider's (once per call)."""
        now = time.monotonic() if now is None else now
        self.good.pop(group, None)
        if len(self.groups) < GOOD_KEPT:
            self.groups.add(group)
        self.failures += 1
        self.probe = 0
        self.error = error
        if self.failures >= self.threshold:
            if self.failures == self.threshold:
                self.opened_at = now
            self.open_until = now + self.cooldown

    def open_for(self, group: int, now: float | None = None) -> bool:
        """Whether ``group``'s calls are skipped now (open, not only another group's doing, and not
        answered lately)."""
        if self.failures < self.threshold or not self._blames(group):
            return False
        now = time.monotonic() if now is None else now
        return now < self.open_until and self.good.get(group, -math.inf) <= now - self.cooldown

    def _blames(self, group: int) -> bool:
        """Whether the failures since the last success are the provider's (more than one group's) or
        ``group``'s own."""
        return len(self.groups) > 1 or group in self.groups

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``, as the operator sees it (/readyz, /metrics): open
        also while only the group whose calls opened it is refused (see the module's docstring)."""
        if self.failures < self.threshold:
            return "closed"
        return "half-open" if time.monotonic() >= self.open_until else "open"

    def why(self) -> dict[str, Any] | None:
        """Why the circuit is not closed, for the operator (/readyz): whom it refuses, on what evidence."""
        state = self.state
        if state == "closed":
            return None
        now = time.monotonic()
        return {
            "state": state,
            "refuses": "every group" if len(self.groups) > 1 else "one group",
            "failed_calls": self.failures,
            "groups": len(self.groups),
            "last_error": self.error,
            "opened_seconds_ago": round(now - self.opened_at, 1),
            "probe_in_seconds": round(max(self.open_until - now, 0.0), 1),
        }


class Breakers:
    """One breaker per deployment; ``states()`` for /readyz and /metrics, ``reasons()`` for /readyz."""

    def __init__(
        self, threshold: int, cooldown: float, probe_timeout: float = 300.0, providers: Iterable[str] = ()
    ) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self._by_provider: dict[str, Breaker] = {}
        for provider in providers:
            self[provider]
        metrics.watch_circuits(self)

    def __getitem__(self, provider: str) -> Breaker:
        breaker = self._by_provider.get(provider)
        if breaker is None:
            breaker = self._by_provider[provider] = Breaker(self.threshold, self.cooldown, self.probe_timeout)
        return breaker

    def states(self) -> dict[str, str]:
        return {provider: b.state for provider, b in sorted(self._by_provider.items())}

    def reasons(self) -> dict[str, dict[str, Any]]:
        """The circuits that are not closed, each with :meth:`Breaker.why`."""
        out = {}
        for provider, breaker in sorted(self._by_provider.items()):
            why = breaker.why()
            if why is not None:
                out[provider] = why
        return out


def closed(
    breakers: Breakers,
    deps: tuple[Deployment, ...],
    group: int,
    skipped: set[str] | frozenset[str] = frozenset(),
) -> tuple[Deployment, ...]:
    """The deployments whose circuit is not open for ``group`` (and not ``skipped``), in their order."""
    if len(deps) == 1:  # the usual case: one deployment
        return deps if deps[0].key not in skipped and not breakers[deps[0].key].open_for(group) else ()
    return tuple(d for d in deps if d.key not in skipped and not breakers[d.key].open_for(group))


def circuit_open(provider: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"The provider '{provider}' keeps failing and is skipped for a while (circuit open).",
        code="circuit_open",
    )


def no_deployment(model: Model) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"No deployment of the provider '{model.provider}' serves `{model.id}`.", code="no_deployment"
    )


class UpstreamCall(NamedTuple):
    """A call as :func:`open_upstream` sends it: ``deployments`` are those of ``model``'s provider that
    serve it; ``build`` is its request for a deployment, ``to_error`` what an error answer means;
    ``ask``: its tokens, its conversation and its kind, as routing needs them (gateway/routing.py)."""

    model: Model
    deployments: tuple[Deployment, ...]
    build: Callable[[Deployment], UpstreamRequest]
    to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError]
    deadline: float
    group: int
    ask: Ask


async def open_upstream(gw: Services, call: UpstreamCall, log: list[list[Any]] | None = None) -> Opened:
    """Send ``call`` to one of its deployments and return the response once its status is good,
    moving between deployments and retrying as the module says (gateway/attempts_plan.py decides),
    within its deadline. ``log`` gets each try that failed, ``[deployment, error code, ms]``, and then
    the one that answered, ``[deployment, "ok", ms]``."""
    model, deps = call.model, call.deployments
    if not deps:
        raise no_deployment(model)
    dispatcher, rel = gw.dispatcher, gw.settings.reliability
    pool = dispatcher.pools[model.provider]
    state = dispatcher.state(pool)
    key = model.alias_of or model.id  # rests and latencies are per model
    plan = Attempts(
        deps, call.deadline, rel.max_retries, rel.backoff_base, rel.backoff_max, pool.prefix, model.id
    )
    while True:
        usable = closed(gw.breakers, deps, call.group, plan.skipped)
        if not usable:
            raise plan.last or circuit_open(pool.prefix)
        order = plan.order(dispatcher.order(pool, model, usable, state, call.ask))
        tokens = call.ask.tokens
        got = (
            await state.acquire(order, key, tokens)
            if pool.shared
            else dispatcher.local.acquire_now(order, key, tokens)
        )
        if isinstance(got, Lease):
            step = await _try(gw, call, plan, got, log)
            if isinstance(step, Opened):
                return step
        else:  # every one rests or is at its ceiling: wait for the first back
            step = plan.busy(got, time.monotonic())
        if step.error is not None:
            raise step.error
        if step.do != FAILOVER:
            if step.do == RETRY:
                retried(model.provider)
            await asyncio.sleep(step.seconds)


async def _try(
    gw: Services, call: UpstreamCall, plan: Attempts, lease: Lease, log: list[list[Any]] | None
) -> Opened | Step:
    """One try on ``lease``'s deployment, past its breaker: the response, or what ``plan`` says next."""
    dep = lease.deployment
    breaker = gw.breakers[dep.key]
    ticket = breaker.allow(call.group)
    if ticket == REFUSED:  # half-open, and its one probe is another call's
        lease.owner.release(lease)
        return plan.refused(dep.key)
    began = time.monotonic()
    try:
        response = await _send(gw, call.build(dep), dep, call.to_error)
    except GatewayError as exc:
        error = exc
    else:
        now = time.monotonic()
        breaker.success(call.group, now)
        lease.latency = now - lease.opened_at
        lease.stream = call.ask.stream
        metrics.deployment_call(dep.prefix, dep.name, "ok", lease.latency)
        if log:
            log.append([dep.name, "ok", round((time.monotonic() - began) * 1000, 1)])
        return Opened(response, lease)
    finally:  # a probe that ended without a verdict (a 429, a 4xx, the caller gone): the next probes
        if ticket:
            breaker.release(ticket)
    if log is not None:
        log.append([dep.name, error.code or str(error.status), round((time.monotonic() - began) * 1000, 1)])
    return _failed(gw, call, plan, lease, error)


def _failed(gw: Services, call: UpstreamCall, plan: Attempts, lease: Lease, error: GatewayError) -> Step:
    """What ``error`` teaches the deployment's state, its breaker and the metrics; what ``plan`` says next."""
    dep = lease.deployment
    # (only helps if another serves)
    rest = gw.dispatcher.cooldown(error) if len(call.deployments) > 1 else 0.0
    lease.owner.release(lease, cooldown=rest)
    metrics.deployment_call(
        dep.prefix, dep.name, "rate_limited" if isinstance(error, RateLimited) else "error"
    )
    if rest:
        metrics.deployment_cooldown(dep.prefix, dep.name)
    if plan.counts(dep.key, error):
        gw.breakers[dep.key].failure(call.group, error=error.code or str(error.status))
    elif isinstance(error, UpstreamNotFound):  # its next calls of this model go to the others meanwhile
        gw.dispatcher.pools[call.model.provider].unserved(dep, call.model, UNSERVED)
    return plan.failed(dep.key, error, time.monotonic())


async def _send(
    gw: Services,
    upstream: UpstreamRequest,
    dep: Deployment,
    to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError],
) -> aiohttp.ClientResponse:
    """One attempt: the response once its headers say it succeeded, else the error it means."""
    call = traced() if gw.tracing is not None else None
    if call is not None:  # one span per attempt (gateway/tracing.py), its traceparent sent upstream
        with call.attempt(dep, upstream.headers) as span:
            response = await _attempt(gw, upstream, dep, to_error)
            span.set_attribute("http.response.status_code", response.status)
            return response
    return await _attempt(gw, upstream, dep, to_error)


async def _attempt(
    gw: Services,
    upstream: UpstreamRequest,
    dep: Deployment,
    to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError],
) -> aiohttp.ClientResponse:
    first_byte = gw.settings.reliability.first_byte_timeout
    try:
        with gw.deadlines.after(first_byte):
            gw.store.upstream_wait()  # (the store may write a batch while this call waits)
            response = await gw.transport.open(upstream, dep)
            if response.status >= 400:
                try:
                    body = await response.read()
                finally:
                    response.release()
                raise to_error(response.status, body, response.headers)
            return response
    except TimeoutError:
        metrics.upstream_error(dep.prefix, "timeout")
        raise UpstreamTimeout(
            f"The provider '{dep.prefix}' sent no answer within {first_byte:g} s."
        ) from None


def retried(provider: str) -> None:
    """A retry happened (metrics hook)."""
    metrics.retry(provider)
