"""Keeping calls alive when an upstream stumbles: which failures to retry, how long to wait, and a
circuit breaker per provider.

    open_upstream  sends one upstream request, retrying what is worth retrying, and keeps the
                provider's circuit breaker informed
    retryable   upstream 429 / 500 / 502 / 503 / 504 / 529, connection failures, first-byte timeouts —
                only before the first byte has gone to the caller, within the request's deadline
    failover    what a fallback model may not have (gateway.pipeline tries the next candidate)
    backoff     base × 2^attempt, capped, times a jitter factor in (0.5, 1]; an upstream Retry-After
                (seconds) is honoured when it fits in what is left of the deadline
    breaker     after ``threshold`` consecutive failures a provider is skipped for ``cooldown``
                seconds, then one probe call is let through: success closes it, failure opens it again.
                Only the provider's own failures count (5xx, connection failures, timeouts, its refusal
                of our credentials or credit). A probe that ends any other way (the caller's 402 or 4xx,
                the caller hanging up, an upstream 4xx or 429) is released: the next call probes again.
                A probe that is never released (a bug) expires after ``probe_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import aiohttp

from adapters.base import UpstreamRequest
from core import metrics
from core.errors import (
    GatewayError,
    RateLimited,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamFinal,
    UpstreamQuotaExceeded,
    UpstreamTimeout,
    UpstreamUnavailable,
)

if TYPE_CHECKING:
    from gateway.state import Gateway


def retryable(exc: GatewayError) -> bool:
    """A failure worth another try (the same upstream later, or a fallback): a rate limit, an upstream
    5xx, overload, timeout or dropped connection; not an ``UpstreamFinal`` one (core/errors.py)."""
    return isinstance(exc, RateLimited | UpstreamError) and not isinstance(exc, UpstreamFinal)


def failover(exc: GatewayError) -> bool:
    """A failure that a fallback model (another upstream) may not have: retryable ones, the provider
    rejecting the gateway's own credentials, and the gateway's account there being out of credit."""
    return retryable(exc) or isinstance(exc, UpstreamAuthFailed | UpstreamQuotaExceeded)


def breaker_failure(exc: GatewayError) -> bool:
    """Failures that count against a provider's health (rate limits do not)."""
    return failover(exc) and not isinstance(exc, RateLimited)


def backoff(attempt: int, base: float, cap: float, retry_after: str | None = None) -> float:
    if retry_after:
        try:
            return max(float(retry_after), 0.0)
        except ValueError:
            pass
    return min(cap, base * (2**attempt)) * (0.5 + random.random() / 2)


REFUSED = -1  # Breaker.allow: the circuit is open (or its one probe is in flight)
PASS = 0  # Breaker.allow: closed, the call goes through; a positive number is a probe's ticket


class Breaker:
    __slots__ = ("threshold", "cooldown", "probe_timeout", "failures", "open_until", "probe", "probe_until",
                 "_tickets")  # fmt: skip

    def __init__(self, threshold: int, cooldown: float, probe_timeout: float = 300.0) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self.failures = 0
        self.open_until = 0.0
        self.probe = 0  # the ticket of the probe in flight (half-open), 0 if none
        self.probe_until = 0.0
        self._tickets = 0

    def allow(self, now: float | None = None) -> int:
        """``PASS``, ``REFUSED``, or a probe's ticket (> 0), which the caller must hand back to
        :meth:`release` however the call ends (``success``/``failure`` also end the probe)."""
        if self.failures < self.threshold:
            return PASS
        now = time.monotonic() if now is None else now
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

    def success(self) -> None:
        self.failures = 0
        self.probe = 0

    def failure(self, now: float | None = None) -> None:
        self.failures += 1
        self.probe = 0
        if self.failures >= self.threshold:
            self.open_until = (time.monotonic() if now is None else now) + self.cooldown

    @property
    def state(self) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "half-open" if time.monotonic() >= self.open_until else "open"


class Breakers:
    """One breaker per provider; ``states()`` for /readyz and /metrics."""

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


def circuit_open(provider: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"The provider '{provider}' keeps failing and is skipped for a while (circuit open).", code="circuit_open"
    )


async def open_upstream(gw: Gateway, upstream: UpstreamRequest, provider: str,
                        to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError],
                        deadline: float) -> aiohttp.ClientResponse:  # fmt: skip
    """Send ``upstream`` and return the response once its status is good, retrying what is worth
    retrying (:func:`retryable`) within ``deadline``, and keeping the provider's circuit breaker
    informed. Before the first byte has gone to the caller, so a retry is invisible to it."""
    rel = gw.settings.reliability
    breaker = gw.breakers[provider]
    target = gw.providers[provider]
    attempt = 0
    while True:
        try:
            with gw.deadlines.after(rel.first_byte_timeout):
                response = await gw.transport.open(upstream, target)
                if response.status >= 400:
                    try:
                        error_body = await response.read()
                    finally:
                        response.release()
                    raise to_error(response.status, error_body, response.headers)
        except TimeoutError:
            metrics.upstream_error(provider, "timeout")
            error: GatewayError = UpstreamTimeout(
                f"The provider '{provider}' sent no answer within {rel.first_byte_timeout:g} s."
            )
        except GatewayError as exc:
            error = exc
        else:
            breaker.success()
            return response
        if breaker_failure(error):
            breaker.failure()
        wait = backoff(attempt, rel.backoff_base, rel.backoff_max, error.headers.get("Retry-After"))
        if not retryable(error) or attempt >= rel.max_retries or time.monotonic() + wait > deadline:
            raise error
        attempt += 1
        retried(provider)
        await asyncio.sleep(wait)


def retried(provider: str) -> None:
    """A retry happened (metrics hook)."""
    metrics.retry(provider)
