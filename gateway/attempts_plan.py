"""What a call does after each outcome of its tries on its provider's deployments, decided without I/O.

    retryable   upstream 429 / 500 / 502 / 503 / 504 / 529, connection failures, first-byte timeouts —
                only before the first byte has gone to the caller, within the request's deadline; not
                OpenAI's "Request too large" 429 (the call alone is over the account's tokens per
                minute): it moves to another deployment at once, never rests one, never retries
    failover    what a fallback model may not have (gateway.pipeline tries the next candidate)
    backoff     base × 2^attempt, capped, times a jitter factor in (0.5, 1]; an upstream Retry-After
                (seconds) is honoured when it fits in what is left of the deadline
    Attempts    one call's tries: the deployments it tried (they come last in its order), those whose
                circuit's one probe is another call's (skipped), those whose breaker has its failure
                (a call counts once per deployment), the retries it spent and its last error. After a
                failure it fails over at once to a deployment not tried yet, else retries after a
                backoff, else gives up; when every deployment rests or is at its ceiling it waits for
                the first to come back, which spends a retry unless the last failure's retry already
                did (that wait is the retry)

gateway/reliability.py ``open_upstream`` performs what these decide (acquire, the breakers, send, sleep).
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from core.deployments import Deployment
from core.errors import (
    GatewayError,
    RateLimited,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamFinal,
    UpstreamNotFound,
    UpstreamQuotaExceeded,
    UpstreamTooLarge,
)


def retryable(exc: GatewayError) -> bool:
    """A failure worth another try (the same upstream later, or a fallback): a rate limit, an upstream
    5xx, overload, timeout or dropped connection; not an ``UpstreamFinal`` one (core/errors.py)."""
    return isinstance(exc, RateLimited | UpstreamError) and not isinstance(exc, UpstreamFinal)


def failover(exc: GatewayError) -> bool:
    """A failure that a fallback model (another upstream) may not have: retryable ones, the provider
    rejecting the gateway's own credentials, the gateway's account there being out of credit, the
    deployment not having the model or endpoint (404), and the call being larger than that account's
    tokens per minute (another account may be larger)."""
    return retryable(exc) or isinstance(
        exc, UpstreamAuthFailed | UpstreamQuotaExceeded | UpstreamTooLarge | UpstreamNotFound
    )


def breaker_failure(exc: GatewayError) -> bool:
    """Failures that count against a provider's health (rate limits, a call too large and a model or
    endpoint one deployment lacks do not: the deployment serves its other calls)."""
    return failover(exc) and not isinstance(exc, RateLimited | UpstreamTooLarge | UpstreamNotFound)


def backoff(attempt: int, base: float, cap: float, retry_after: str | None = None) -> float:
    if retry_after:
        try:
            return max(float(retry_after), 0.0)
        except ValueError:
            pass
    return min(cap, base * (2**attempt)) * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not a secret)


def all_busy(prefix: str, model_id: str, wait: float) -> RateLimited:
    if wait == math.inf:  # no wait cures it: the SDKs are told not to retry
        return RateLimited(
            f"The call is larger than the tokens-per-minute ceiling of every deployment of the "
            f"provider '{prefix}' that serves `{model_id}`; send a shorter prompt or lower max_tokens.",
            final=True,
        )
    seconds = max(math.ceil(wait), 1)
    return RateLimited(
        f"Every deployment of the provider '{prefix}' that serves `{model_id}` is cooling down or at its rate "
        f"ceiling; retry in {seconds} s.",
        headers={"Retry-After": str(seconds), "retry-after-ms": str(max(math.ceil(wait * 1000), 1))},
    )


FAILOVER = "failover"  # to a deployment not tried yet, at once: no wait, no retry spent
RETRY = "retry"  # after ``seconds``: a retry spent
WAIT = "wait"  # ``seconds`` for a deployment to come back, the retry the last failure spent
GIVE_UP = "give up"  # with ``error``


class Step(NamedTuple):
    do: str
    seconds: float = 0.0
    error: GatewayError | None = None


NOW = Step(FAILOVER)


class Attempts:
    """One call's tries on ``deps`` (its provider's deployments that serve its model), within
    ``deadline`` (monotonic seconds) and ``max_retries``; ``prefix`` and ``model_id`` name them in
    the error when every one is busy."""

    __slots__ = (
        "deps",
        "deadline",
        "max_retries",
        "base",
        "cap",
        "prefix",
        "model_id",
        "tried",
        "skipped",
        "counted",
        "attempt",
        "waited",
        "last",
    )

    def __init__(
        self,
        deps: tuple[Deployment, ...],
        deadline: float,
        max_retries: int,
        base: float,
        cap: float,
        prefix: str,
        model_id: str,
    ) -> None:
        self.deps = deps
        self.deadline = deadline
        self.max_retries = max_retries
        self.base = base  # backoff
        self.cap = cap
        self.prefix = prefix
        self.model_id = model_id
        self.tried: set[str] = set()  # failed this call: the others first
        self.skipped: set[str] = set()  # their circuit's one probe is another call's
        self.counted: set[str] = set()  # their breaker has this call's failure
        self.attempt = 0  # retries spent
        self.waited = False  # the last step spent a retry on a wait (the next wait for a deployment is it)
        self.last: GatewayError | None = None

    def order(self, ranked: list[Deployment]) -> list[Deployment]:
        """``ranked`` (the strategy's order) with the deployments not tried yet first."""
        tried = self.tried
        if not tried:
            return ranked
        return [d for d in ranked if d.key not in tried] + [d for d in ranked if d.key in tried]

    def busy(self, wait: float, now: float) -> Step:
        """Every deployment rests or is at its ceiling, the first back in ``wait`` seconds."""
        if now + wait > self.deadline:
            return Step(GIVE_UP, error=all_busy(self.prefix, self.model_id, wait))
        if self.waited:
            self.waited = False
            return Step(WAIT, wait)
        if self.attempt >= self.max_retries:
            return Step(GIVE_UP, error=all_busy(self.prefix, self.model_id, wait))
        self.attempt += 1
        return Step(RETRY, wait)

    def refused(self, key: str) -> Step:
        """The breaker of deployment ``key`` is half-open and its one probe is another call's: skip it."""
        self.waited = False
        self.skipped.add(key)
        return NOW

    def counts(self, key: str, error: GatewayError) -> bool:
        """Whether deployment ``key``'s breaker is to count ``error``: a provider's failure, the
        first of this call there."""
        if not breaker_failure(error) or key in self.counted:
            return False
        self.counted.add(key)
        return True

    def failed(self, key: str, error: GatewayError, now: float) -> Step:
        """Deployment ``key`` answered ``error``."""
        self.waited = False
        if not failover(error):
            return Step(GIVE_UP, error=error)
        self.last = error
        self.tried.add(key)
        if any(d.key not in self.tried and d.key not in self.skipped for d in self.deps):
            return NOW
        wait = backoff(self.attempt, self.base, self.cap, error.headers.get("Retry-After"))
        if not retryable(error) or self.attempt >= self.max_retries or now + wait > self.deadline:
            return Step(GIVE_UP, error=error)
        self.attempt += 1
        self.waited = True
        return Step(RETRY, wait)
