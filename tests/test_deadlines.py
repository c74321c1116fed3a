"""core/deadlines.py: one timer for many deadlines, with asyncio.timeout's behaviour."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.deadlines import Deadlines


async def test_a_passed_deadline_raises_timeout_error_within_a_tick() -> None:
    deadlines = Deadlines(tick=0.02)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.after(0.1):
            await asyncio.sleep(5)
    took = time.monotonic() - began
    assert 0.1 <= took < 0.1 + 0.02 + 0.2  # one tick late at most, plus a busy machine's slack
    assert not deadlines._open


async def test_blocks_that_end_in_time_leave_nothing_open_and_the_timer_stops() -> None:
    deadlines = Deadlines(tick=0.01)
    for _ in range(3):
        with deadlines.after(1.0):
            await asyncio.sleep(0)
    assert not deadlines._open
    await asyncio.sleep(0.05)  # the timer looked once more, found nothing, and was not re-armed
    assert deadlines._timer is None


async def test_only_the_expired_task_is_cancelled() -> None:
    deadlines = Deadlines(tick=0.01)

    async def wait(seconds: float, sleep: float) -> str:
        with deadlines.after(seconds):
            await asyncio.sleep(sleep)
        return "done"

    results = await asyncio.gather(wait(0.05, 1), wait(1, 0.1), return_exceptions=True)
    assert isinstance(results[0], TimeoutError)
    assert results[1] == "done"


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    deadlines = Deadlines(tick=0.01)

    async def wait() -> None:
        with deadlines.after(10):
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._open


async def test_a_timeout_inside_is_caught_by_the_caller_and_the_task_goes_on() -> None:
    deadlines = Deadlines(tick=0.01)
    with pytest.raises(TimeoutError):
        with deadlines.after(0.02):
            await asyncio.sleep(1)
    await asyncio.sleep(0.01)  # not cancelled again: the task's cancel was taken back
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_many_deadlines_of_different_lengths_fire_in_their_own_time() -> None:
    """Kept by length, each set in the order they pass: a look stops at the first that has not passed
    in each set, and a short deadline entered after a long one still fires first."""
    deadlines = Deadlines(tick=0.01)

    async def wait(seconds: float) -> float:
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            with deadlines.after(seconds):
                await asyncio.sleep(5)
        return time.monotonic() - began

    long = [asyncio.ensure_future(wait(0.4)) for _ in range(3)]
    await asyncio.sleep(0.05)
    short = [asyncio.ensure_future(wait(0.1)) for _ in range(3)]
    took = await asyncio.gather(*short)
    assert all(0.1 <= t < 0.3 for t in took) and not any(t.done() for t in long), took
    assert all(0.4 <= t < 0.6 for t in await asyncio.gather(*long))
    assert not deadlines._open


async def test_an_idle_deadline_counts_only_its_waits() -> None:
    """``Deadlines.idle``: open across many waits, each ``seconds`` from its ``renew()``; the time
    between a ``pause()`` and the next renewal is not counted; a wait too long is a TimeoutError up to
    a look (IDLE_LOOK) late, and the task's cancel is taken back."""
    from core.deadlines import IDLE_LOOK

    deadlines = Deadlines(tick=0.01)
    with deadlines.idle(0.3) as idle:
        for _ in range(3):  # waits shorter than the deadline, with pauses longer than it between them
            idle.renew()
            await asyncio.sleep(0.1)
            idle.pause()
            await asyncio.sleep(0.4)
    assert not deadlines._idle
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.idle(0.3) as idle:
            idle.renew()
            await asyncio.sleep(5)
    assert 0.3 <= time.monotonic() - began < 0.3 + IDLE_LOOK + 0.3
    assert not deadlines._idle
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
