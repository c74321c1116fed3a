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
                seconds, then one probe call is let through: success closes it, failure opens it again
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
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


class Breaker:
    __slots__ = ("threshold", "cooldown", "failures", "open_until", "probing")

    def __init__(self, threshold: int, cooldown: float) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self.open_until = 0.0
        self.probing = False

    def allow(self, now: float | None = None) -> bool:
        if self.failures < self.threshold:
            return True
        now = time.monotonic() if now is None else now
        if now < self.open_until or self.probing:
            return False
        self.probing = True  # half-open: this call is the probe
        return True

    def success(self) -> None:
        self.failures = 0
        self.probing = False

    def failure(self, now: float | None = None) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.threshold:
            self.open_until = (time.monotonic() if now is None else now) + self.cooldown

    @property
    def state(self) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "half-open" if time.monotonic() >= self.open_until else "open"


class Breakers:
    def __init__(self, threshold: int, cooldown: float) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self._by_provider: dict[str, Breaker] = {}

    def __getitem__(self, provider: str) -> Breaker:
        breaker = self._by_provider.get(provider)
        if breaker is None:
            breaker = self._by_provider[provider] = Breaker(self.threshold, self.cooldown)
        return breaker


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
