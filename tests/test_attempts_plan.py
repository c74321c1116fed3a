"""A call's decisions between its tries (gateway/attempts_plan.py), without I/O: sequences of outcomes
(a deployment failed, every one is busy, a breaker refused) and the step each one leads to."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.deployments import Deployment
from core.errors import (
    GatewayError,
    InvalidRequest,
    RateLimited,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamNotFound,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from gateway.attempts_plan import FAILOVER, GIVE_UP, RETRY, WAIT, Attempts, Step

DOWN = UpstreamUnavailable("down")
SLOW = RateLimited("slow down", headers={"Retry-After": "3"})
LATER = RateLimited("much later", headers={"Retry-After": "30"})
NOW_AGAIN = UpstreamError("again", headers={"Retry-After": "0"})
CREDENTIALS = UpstreamAuthFailed("our key")
BAD = InvalidRequest("the caller's")
MISSING = UpstreamNotFound("not here")
TOO_LARGE = UpstreamTooLarge("over the account's tpm")


def deployments(*keys: str) -> tuple[Deployment, ...]:
    return tuple(
        Deployment(key, f"http://{key}", "k") for key in keys
    )  # (a single account's key: its prefix)


def plan(names: str = "a", retries: int = 2, deadline: float = 10.0) -> Attempts:
    return Attempts(deployments(*names), deadline, retries, 1.0, 8.0, "p1", "openai/m")


def play(attempts: Attempts, outcomes: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each outcome's step, the clock moving on by each wait: ``(do, seconds)``, or ``(GIVE_UP, error)``."""
    now, steps = 0.0, []
    for outcome in outcomes:
        kind, arg = outcome
        if kind == "failed":
            key, error = arg
            step = attempts.failed(key, error, now)
        elif kind == "busy":
            step = attempts.busy(arg, now)
        else:
            step = attempts.refused(arg)
        now += step.seconds
        steps.append((GIVE_UP, step.error) if step.error is not None else (step.do, step.seconds))
    return steps


CASES: list[tuple[str, Attempts, list[tuple[Any, ...]], list[tuple[Any, ...]]]] = [
    (
        "several deployments: each failure moves to the next at once, no retry spent",
        plan("abc", retries=0),
        [("failed", ("a", DOWN)), ("failed", ("b", DOWN)), ("failed", ("c", DOWN))],
        [(FAILOVER, 0.0), (FAILOVER, 0.0), (GIVE_UP, DOWN)],
    ),
    (
        "once every deployment was tried, a retry (honouring Retry-After), then the retries run out",
        plan("ab", retries=1),
        [("failed", ("a", DOWN)), ("failed", ("b", SLOW)), ("failed", ("b", DOWN))],
        [(FAILOVER, 0.0), (RETRY, 3.0), (GIVE_UP, DOWN)],
    ),
    (
        "a retryable failure is retried up to max_retries",
        plan("a", retries=2),
        [("failed", ("a", SLOW)), ("failed", ("a", SLOW)), ("failed", ("a", SLOW))],
        [(RETRY, 3.0), (RETRY, 3.0), (GIVE_UP, SLOW)],
    ),
    ("Retry-After: 0 is a retry at once", plan("a"), [("failed", ("a", NOW_AGAIN))], [(RETRY, 0.0)]),
    (
        "a final upstream failure fails over to another deployment but is never retried",
        plan("ab"),
        [("failed", ("a", CREDENTIALS)), ("failed", ("b", CREDENTIALS))],
        [(FAILOVER, 0.0), (GIVE_UP, CREDENTIALS)],
    ),
    (
        "a failure of the caller's request gives up at once, other deployments or not",
        plan("ab"),
        [("failed", ("a", BAD))],
        [(GIVE_UP, BAD)],
    ),
    (
        "a call too large for one account tries the others, never retries",
        plan("ab"),
        [("failed", ("a", TOO_LARGE)), ("failed", ("b", TOO_LARGE))],
        [(FAILOVER, 0.0), (GIVE_UP, TOO_LARGE)],
    ),
    ("a Retry-After past the deadline gives up", plan("a"), [("failed", ("a", LATER))], [(GIVE_UP, LATER)]),
    (
        "Retry-After fits the first time; the second would end past the deadline",
        plan("a", retries=5, deadline=5.0),
        [("failed", ("a", SLOW)), ("failed", ("a", SLOW))],
        [(RETRY, 3.0), (GIVE_UP, SLOW)],
    ),
    (
        "the probe another call holds is skipped, the next deployment tried at once",
        plan("ab"),
        [("refused", "a"), ("failed", ("b", SLOW))],
        [(FAILOVER, 0.0), (RETRY, 3.0)],
    ),
]


@pytest.mark.parametrize(
    ("attempts", "outcomes", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_each_outcome_leads_to_its_step(attempts: Attempts, outcomes: list[Any], expected: list[Any]) -> None:
    assert play(attempts, outcomes) == expected


def test_every_deployment_busy_waits_for_the_first_back_and_that_wait_spends_the_retry_once() -> None:
    after_failure = plan("a", retries=1)
    steps = play(after_failure, [("failed", ("a", SLOW)), ("busy", 2.0), ("busy", 2.0)])
    assert steps[:2] == [(RETRY, 3.0), (WAIT, 2.0)]  # the wait is the retry the failure spent
    assert steps[2][0] == GIVE_UP and steps[2][1].headers["Retry-After"] == "2"
    busy_first = plan("a", retries=1)
    steps = play(busy_first, [("busy", 1.5), ("busy", 1.5)])
    assert steps[0] == (RETRY, 1.5)
    assert (
        steps[1][0] == GIVE_UP
        and isinstance(steps[1][1], RateLimited)
        and steps[1][1].headers["Retry-After"] == "2"
    )
    refused_between = plan(
        "ab", retries=2
    )  # a lease (refused here) ends the waiting: the next wait is a retry
    assert play(
        refused_between, [("failed", ("a", SLOW)), ("failed", ("b", SLOW)), ("refused", "a"), ("busy", 1.0)]
    ) == [(FAILOVER, 0.0), (RETRY, 3.0), (FAILOVER, 0.0), (RETRY, 1.0)]


def test_every_deployment_busy_past_the_deadline_or_forever_gives_up() -> None:
    [(do, error)] = play(plan("a", deadline=10.0), [("busy", 11.0)])
    assert do == GIVE_UP and isinstance(error, RateLimited) and not error.final
    [(do, error)] = play(plan("a", deadline=10.0), [("busy", math.inf)])
    assert do == GIVE_UP and error.final and "tokens-per-minute" in error.message


def test_backoff_without_retry_after_doubles_with_jitter() -> None:
    attempts = plan("a", retries=3, deadline=100.0)
    waits = [step[1] for step in play(attempts, [("failed", ("a", DOWN))] * 3)]
    assert 0.5 < waits[0] <= 1.0 and 1.0 < waits[1] <= 2.0 and 2.0 < waits[2] <= 4.0
    assert attempts.attempt == 3


def test_a_breaker_counts_a_call_once_per_deployment_and_only_the_providers_failures() -> None:
    attempts = plan("ab")
    assert [attempts.counts("a", DOWN), attempts.counts("a", DOWN), attempts.counts("b", DOWN)] == [
        True,
        False,
        True,
    ]
    fresh = plan("ab")
    for error in (SLOW, TOO_LARGE, MISSING, BAD):
        assert not fresh.counts("a", error)
    assert fresh.counts("a", CREDENTIALS)


def test_deployments_tried_come_last_in_the_strategys_order() -> None:
    attempts = plan("abc")
    a, b, c = attempts.deps
    assert attempts.order([c, a, b]) == [c, a, b]
    attempts.failed("c", DOWN, 0.0)
    attempts.failed("a", DOWN, 0.0)
    assert attempts.order([c, a, b]) == [b, c, a]
    assert attempts.last is DOWN


def test_no_deployment_left_gives_up_with_the_last_failure() -> None:
    attempts = plan("ab")
    assert attempts.refused("a") == Step(FAILOVER)
    assert attempts.failed("b", SLOW, 0.0) == Step(RETRY, 3.0) and attempts.skipped == {"a"}
    assert isinstance(attempts.last, GatewayError) and attempts.last is SLOW
