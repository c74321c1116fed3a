"""Keeping calls alive when an upstream stumbles: which failures to retry, how long to wait, moving
to another deployment of the provider, and a circuit breaker per deployment.

    open_upstream  sends a call to one of its provider's deployments (gateway/dispatch.py orders
                them), moving to the next at once on a failure a fallback model might not have,
                before any retry or fallback model; retrying what is worth retrying once every
                deployment was tried; and keeps each deployment's circuit breaker and rest informed.
                A deployment's 429 rests it, for that model, for its Retry-After (``[routing]
                cooldown`` without one), as does any failure that says when to come back; when every
                deployment rests or is at its RPM/TPM ceiling the call waits for the first to come back
                (a retry) or is a 429 with that Retry-After. A model one deployment alone serves does
                not rest: the retries honour the upstream's Retry-After, as they always did.
    retryable   upstream 429 / 500 / 502 / 503 / 504 / 529, connection failures, first-byte timeouts —
                only before the first byte has gone to the caller, within the request's deadline; not
                OpenAI's "Request too large" 429 (the call alone is over the account's tokens per
                minute): it moves to another deployment at once, never rests one, never retries
    failover    what a fallback model may not have (gateway.pipeline tries the next candidate)
    backoff     base × 2^attempt, capped, times a jitter factor in (0.5, 1]; an upstream Retry-After
                (seconds) is honoured when it fits in what is left of the deadline
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
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import aiohttp

from adapters.base import UpstreamRequest
from core import metrics
from core.catalog import Model
from core.deployments import Deployment
from core.errors import (
    GatewayError,
    RateLimited,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamFinal,
    UpstreamNotFound,
    UpstreamQuotaExceeded,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from gateway.routing import Ask
from gateway.tracing import current as traced
from gateway.upstream_state import Lease

if TYPE_CHECKING:
    from gateway.state import Gateway


class Opened(NamedTuple):
    response: aiohttp.ClientResponse
    lease: Lease  # released when the call ends (its latency into the deployment's average)


def retryable(exc: GatewayError) -> bool:
    """A failure worth another try (the same upstream later, or a fallback): a rate limit, an upstream
    5xx, overload, timeout or dropped connection; not an ``UpstreamFinal`` one (core/errors.py)."""
    return isinstance(exc, RateLimited | UpstreamError) and not isinstance(exc, UpstreamFinal)


def failover(exc: GatewayError) -> bool:
    """A failure that a fallback model (another upstream) may not have: retryable ones, the provider
    rejecting the gateway's own credentials, the gateway's account there being out of credit, the
    deployment not having the model or endpoint (404), and the call being larger than that account's
    tokens per minute (another account may be larger)."""
    return retryable(exc) or isinstance(exc, UpstreamAuthFailed | UpstreamQuotaExceeded | UpstreamTooLarge
                                        | UpstreamNotFound)  # fmt: skip


def breaker_failure(exc: GatewayError) -> bool:
    """Failures that count against a provider's health (rate limits, a call too large and a model or
    endpoint one deployment lacks do not: the deployment serves its other calls)."""
    return failover(exc) and not isinstance(exc, RateLimited | UpstreamTooLarge | UpstreamNotFound)


UNSERVED = 60.0  # seconds a deployment that answered 404 for a model is left out of that model's calls


def backoff(attempt: int, base: float, cap: float, retry_after: str | None = None) -> float:
    if retry_after:
        try:
            return max(float(retry_after), 0.0)
        except ValueError:
            pass
    return min(cap, base * (2**attempt)) * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not a secret)


REFUSED = -1  # Breaker.allow: the circuit is open (or its one probe is in flight)
PASS = 0  # Breaker.allow: closed, the call goes through; a positive number is a probe's ticket
GOOD_KEPT = 4096  # groups whose last success a breaker remembers before it forgets the stale ones


class Breaker:
    """One deployment's circuit (the module's docstring says when it opens, for whom, and how it closes)."""

    __slots__ = ("threshold", "cooldown", "probe_timeout", "failures", "open_until", "probe", "probe_until",
                 "groups", "good", "error", "opened_at", "_tickets")  # fmt: skip

    def __init__(self, threshold: int, cooldown: float, probe_timeout: float = 300.0) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self.failures = 0  # failed calls since the last success (a call counts once however often it was tried)
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
        return {"state": state, "refuses": "every group" if len(self.groups) > 1 else "one group",
                "failed_calls": self.failures, "groups": len(self.groups), "last_error": self.error,
                "opened_seconds_ago": round(now - self.opened_at, 1),
                "probe_in_seconds": round(max(self.open_until - now, 0.0), 1)}  # fmt: skip


class Breakers:
    """One breaker per deployment; ``states()`` for /readyz and /metrics, ``reasons()`` for /readyz."""

    def __init__(self, threshold: int, cooldown: float, probe_timeout: float = 300.0,
                 providers: Iterable[str] = ()) -> None:  # fmt: skip
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


def closed(breakers: Breakers, deps: tuple[Deployment, ...], group: int,
           skipped: set[str] | frozenset[str] = frozenset()) -> tuple[Deployment, ...]:  # fmt: skip
    """The deployments whose circuit is not open for ``group`` (and not ``skipped``), in their order."""
    if len(deps) == 1:  # the usual case: one deployment
        return deps if deps[0].key not in skipped and not breakers[deps[0].key].open_for(group) else ()
    return tuple(d for d in deps if d.key not in skipped and not breakers[d.key].open_for(group))


def circuit_open(provider: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"The provider '{provider}' keeps failing and is skipped for a while (circuit open).", code="circuit_open"
    )


def all_busy(prefix: str, model_id: str, wait: float) -> RateLimited:
    if wait == math.inf:  # no wait cures it: the SDKs are told not to retry
        return RateLimited(f"The call is larger than the tokens-per-minute ceiling of every deployment of the "
                           f"provider '{prefix}' that serves `{model_id}`; send a shorter prompt or lower max_tokens.",
                           final=True)  # fmt: skip
    seconds = max(math.ceil(wait), 1)
    return RateLimited(
        f"Every deployment of the provider '{prefix}' that serves `{model_id}` is cooling down or at its rate "
        f"ceiling; retry in {seconds} s.",
        headers={"Retry-After": str(seconds), "retry-after-ms": str(max(math.ceil(wait * 1000), 1))},
    )


def no_deployment(model: Model) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"No deployment of the provider '{model.provider}' serves `{model.id}`.",
                               code="no_deployment")  # fmt: skip


async def open_upstream(gw: Gateway, model: Model, deps: tuple[Deployment, ...],
                  build: Callable[[Deployment], UpstreamRequest],
                  to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError], deadline: float,
                  group: int, ask: Ask, attempts: list[list[Any]] | None = None) -> Opened:  # fmt: skip
    """Send ``group``'s call to one of ``deps`` (deployments of ``model``'s provider that serve it) and return
    the response once its status is good, moving between deployments and retrying as the module says,
    within ``deadline``. ``build`` is the call's request for a deployment; ``ask``: its tokens, its
    conversation and its kind, as routing needs them (gateway/routing.py). ``attempts`` gets each one
    that failed, ``[deployment, error code, ms]``, and then the one that answered, ``[deployment, "ok", ms]``."""
    if not deps:
        raise no_deployment(model)
    dispatcher = gw.dispatcher
    pool = dispatcher.pools[model.provider]
    state = dispatcher.state(pool)
    key = model.alias_of or model.id  # rests and latencies are per model
    several = len(deps) > 1  # a rest only helps when another deployment can serve meanwhile
    rel = gw.settings.reliability
    tried: set[str] = set()  # failed this call: the others first
    skipped: set[str] = set()  # their circuit's one probe is another call's
    counted: set[str] = set()  # their breaker has this call's failure (a call counts once)
    attempt = 0
    waited = False  # the last step was a wait for a deployment to come back (that retry is spent)
    last: GatewayError | None = None
    while True:
        usable = closed(gw.breakers, deps, group, skipped)
        if not usable:
            raise last or circuit_open(pool.prefix)
        order = dispatcher.order(pool, model, usable, state, ask)
        if tried:  # deployments not tried yet come first, in the strategy's order
            order = [d for d in order if d.key not in tried] + [d for d in order if d.key in tried]
        got = await state.acquire(order, key, ask.tokens) if pool.shared else dispatcher.local.acquire_now(order, key, ask.tokens)
        if not isinstance(got, Lease):  # every one rests or is at its ceiling: wait for the first back
            busy = all_busy(pool.prefix, model.id, got)
            if time.monotonic() + got > deadline:
                raise busy
            if waited:  # this wait ends the retry the last failure already counted
                waited = False
            elif attempt >= rel.max_retries:
                raise busy
            else:
                attempt += 1
                retried(model.provider)
            await asyncio.sleep(got)
            continue
        waited = False
        dep = got.deployment
        breaker = gw.breakers[dep.key]
        ticket = breaker.allow(group)
        if ticket == REFUSED:  # half-open, and its one probe is another call's
            got.owner.release(got)
            skipped.add(dep.key)
            continue
        began = time.monotonic()
        try:
            response = await _send(gw, build(dep), dep, to_error)
        except GatewayError as exc:
            error = exc
        else:
            now = time.monotonic()
            breaker.success(group, now)
            got.latency = now - got.opened_at
            got.stream = ask.stream
            metrics.deployment_call(dep.prefix, dep.name, "ok", got.latency)
            if attempts:
                attempts.append([dep.name, "ok", round((time.monotonic() - began) * 1000, 1)])
            return Opened(response, got)
        finally:  # a probe that ended without a verdict (a 429, a 4xx, the caller gone): the next probes
            if ticket:
                breaker.release(ticket)
        if attempts is not None:
            attempts.append([dep.name, error.code or str(error.status), round((time.monotonic() - began) * 1000, 1)])
        rest = dispatcher.cooldown(error) if several else 0.0
        got.owner.release(got, cooldown=rest)
        metrics.deployment_call(dep.prefix, dep.name, "rate_limited" if isinstance(error, RateLimited) else "error")
        if rest:
            metrics.deployment_cooldown(dep.prefix, dep.name)
        if breaker_failure(error) and dep.key not in counted:
            counted.add(dep.key)
            breaker.failure(group, error=error.code or str(error.status))
        elif isinstance(error, UpstreamNotFound):  # its next calls of this model go to the others meanwhile
            pool.unserved(dep, model, UNSERVED)
        if not failover(error):
            raise error
        last = error
        tried.add(dep.key)
        if any(d.key not in tried and d.key not in skipped for d in deps):
            continue  # another deployment may serve at once: no backoff, no retry spent
        wait = backoff(attempt, rel.backoff_base, rel.backoff_max, error.headers.get("Retry-After"))
        if not retryable(error) or attempt >= rel.max_retries or time.monotonic() + wait > deadline:
            raise error
        attempt += 1
        retried(model.provider)
        waited = True
        await asyncio.sleep(wait)


async def _send(gw: Gateway, upstream: UpstreamRequest, dep: Deployment,
                to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError]) -> aiohttp.ClientResponse:  # fmt: skip
    """One attempt: the response once its headers say it succeeded, else the error it means."""
    call = traced() if gw.tracing is not None else None
    if call is not None:  # one span per attempt (gateway/tracing.py), its traceparent sent upstream
        with call.attempt(dep, upstream.headers) as span:
            response = await _attempt(gw, upstream, dep, to_error)
            span.set_attribute("http.response.status_code", response.status)
            return response
    return await _attempt(gw, upstream, dep, to_error)


async def _attempt(gw: Gateway, upstream: UpstreamRequest, dep: Deployment,
                   to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError]) -> aiohttp.ClientResponse:  # fmt: skip
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
        raise UpstreamTimeout(f"The provider '{dep.prefix}' sent no answer within {first_byte:g} s.") from None


def retried(provider: str) -> None:
    """A retry happened (metrics hook)."""
    metrics.retry(provider)
