"""The background runner inside the gateway process: claims open batches and runs them (jobs/job.py).

One loop per process looks for work every ``poll_interval`` seconds (at once when a batch is created
or cancelled here) and runs up to ``max_jobs`` batches at a time. A batch is run by the process that
holds its lease (owner and expiry in the batch row, renewed while it runs), so with several replicas on
one PostgreSQL each batch has one runner at a time; a replica that dies leaves its batches to the
others once their leases run out. On SQLite (one gateway per database file) every lease left in the
file is from a process that is gone, so they are all let go on start: a restart resumes at once.

A batch whose run fails (the store could not read its file, a bug) is let go and not claimed again by
this process for a back-off that doubles with each consecutive failure, from 1 s (or ``poll_interval``)
up to ``MAX_BACKOFF`` seconds, so one broken batch costs a log line now and then instead of a busy loop (it
used to be released and re-claimed some 800 times a second). Other replicas keep their own back-off.

Groups share the slots fairly: a claim takes a batch of the group with the fewest batches running
(by any runner), and when every slot is taken and a group's batch waits, a batch of a group running two
or more batches more than it lets its slot go between lines (it stays ``in_progress`` and is claimed
again later; no line is cut short or run twice). One group's many large batches do not hold another's
for hours.

On shutdown the runner stops claiming lines, gives the lines in flight ``stop_grace`` seconds to
finish, then cancels them (they are failed as interrupted, never run again) and lets its leases go.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
import socket
import time
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING

from core.types import ASGIApp
from jobs.backends import open_job_store
from jobs.background import Background
from jobs.job import Job
from jobs.store import BatchRow, JobStore, LineState

if TYPE_CHECKING:
    from gateway.state import BatchView, Gateway

log = logging.getLogger("router.jobs")

MAX_BACKOFF = 300.0  # seconds: the longest a failing batch waits before this process tries it again


class Backoff:
    """Consecutive failures per batch, and until when each is left alone."""

    def __init__(self, base: float, cap: float = MAX_BACKOFF) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[str, tuple[int, float]] = {}

    def failed(self, batch_id: str) -> float:
        """One more failure; returns the seconds the batch is now left alone."""
        count = self._failures.get(batch_id, (0, 0.0))[0] + 1
        wait = min(self.cap, self.base * 2 ** (count - 1))
        self._failures[batch_id] = (count, time.monotonic() + wait)
        return wait

    def succeeded(self, batch_id: str) -> None:
        self._failures.pop(batch_id, None)

    def waiting(self) -> list[str]:
        """The batches not to claim now."""
        now = time.monotonic()
        return [batch_id for batch_id, (_, until) in self._failures.items() if until > now]


class JobRunner:
    def __init__(self, gateway: Gateway, app: ASGIApp, store: JobStore | None = None) -> None:
        self.gw = gateway
        self.app = app  # the gateway's own ASGI app: every line is one in-process call to it
        self.settings = gateway.settings.jobs
        self.store = store or open_job_store(gateway.store, self.settings.data_dir)
        self.exclusive = gateway.store.exclusive  # one gateway per database: every lease left is a dead one's
        self.name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._claims = itertools.count(1)
        self.jobs: dict[str, tuple[Job, asyncio.Task[None]]] = {}
        self.backoff = Backoff(max(1.0, self.settings.poll_interval))
        self.stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.Task[None] | None = None
        # background responses (POST /v1/responses, background: true) and the stored responses' purge
        self.background = Background(gateway, app, self.name, self.store.principal_by_id)

    async def start(self) -> None:
        await self.store.open()
        if not self.settings.runner:
            return
        if self.exclusive:
            freed = await self.store.release_all()
            if freed:
                log.info("resuming %d batch(es) left by a stopped process", freed)
        self.stopping = False
        self._wake = asyncio.Event()
        self._loop = asyncio.create_task(self._run(), name="batch-runner")
        await self.background.start(self.exclusive)

    def poke_background(self) -> None:
        """A background response was queued here: look now."""
        self.background.poke()

    def cancel_background(self, response_id: str) -> None:
        """A background response was cancelled or deleted: stop its call if it runs here."""
        self.background.cancel(response_id)

    # -- the console's view (gateway.state.BatchBook) ------------------------------------------------
    async def browse(
        self, group_id: int | None, status: str | None, before: str | None, limit: int
    ) -> list[BatchRow]:
        return await self.store.browse(group_id, status, before, limit)

    async def batch(self, batch_id: str) -> BatchRow | None:
        return await self.store.get_batch(None, batch_id)

    async def failed_lines(self, batch_id: str, limit: int) -> list[LineState]:
        """The first failed lines: from the batch's lines while it runs, from its error file once it
        has ended (its lines are gone then; an error file's lines have no line number: 0)."""
        lines = await self.store.failed_lines(batch_id, limit)
        batch = None if lines else await self.store.get_batch(None, batch_id)
        if batch is None or batch.error_file_id is None:
            return lines
        data = await self.store.file_content(batch.group_id, batch.error_file_id) or b""
        for raw in data.split(b"\n", limit)[:limit]:
            try:
                custom_id = str(json.loads(raw).get("custom_id", ""))
            except (ValueError, AttributeError):
                continue
            lines.append(LineState(0, custom_id, "failed", raw.decode("utf-8", "replace")))
        return lines

    async def cancel(self, batch: BatchView) -> BatchRow | None:
        """Cancel a batch as its owner could (``POST /v1/batches/{id}/cancel``)."""
        row = await self.store.cancel_batch(batch.group_id, batch.id, int(time.time()))
        self.poke()
        return row

    def poke(self) -> None:
        """There may be new work (a batch created or cancelled here): look now."""
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        self.stopping = True
        await self.background.stop()
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        tasks = [task for _, task in self.jobs.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settings.stop_grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _run(self) -> None:
        assert self._wake is not None
        while not self.stopping:
            self._wake.clear()
            try:
                await self._claim()
            except Exception as exc:  # the store is unreachable, say: try again later
                log.warning("batch runner: could not look for work (%s)", exc)
            with suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval):
                    await self._wake.wait()

    async def _claim(self) -> None:
        while len(self.jobs) < self.settings.max_jobs and not self.stopping:
            owner = f"{self.name}:{next(self._claims)}"
            batch = await self.store.claim_batch(
                owner, self.settings.lease_seconds, [*self.jobs, *self.backoff.waiting()]
            )
            if batch is None:
                return
            job = Job(self, batch, owner)
            task = asyncio.create_task(job.run(), name=f"batch-{batch.id}")
            self.jobs[batch.id] = (job, task)
            task.add_done_callback(partial(self._done, batch.id))
        if not self.stopping:
            await self._make_room()

    async def _make_room(self) -> None:
        """Every slot here runs a batch: if a group's batch waits while a group with at least two more
        batches running (by every runner) holds one of these slots, the newest of those batches here
        lets its slot go after its lines in flight (jobs/job.py, ``yielding``); the claim that follows
        takes the waiting group's (``claim_batch``: fewest running first). One at a time."""
        ours = [job for job, _ in self.jobs.values()]
        if len(ours) < self.settings.max_jobs or any(job.yielding for job in ours):
            return
        load = await self.store.batch_load(self.backoff.waiting())
        waiting = [group.running for group in load.values() if group.waiting]
        if not waiting:
            return
        least = min(waiting)
        crowded = [
            job
            for job in ours
            if job.batch.group_id in load and load[job.batch.group_id].running >= least + 2
        ]
        if not crowded:
            return
        most = max(load[job.batch.group_id].running for job in crowded)
        job = [job for job in crowded if load[job.batch.group_id].running == most][-1]
        job.yielding = True
        log.info(
            "batch %s lets its slot go for a while: its group runs %d batches, another group's waits with %d",
            job.batch.id,
            most,
            least,
        )

    def _done(self, batch_id: str, _task: object = None) -> None:
        job, _ = self.jobs.pop(batch_id, (None, None))
        if job is not None and job.crashed:
            wait = self.backoff.failed(batch_id)
            log.warning("batch %s: left alone for %.0f s before it is tried again", batch_id, wait)
        else:
            self.backoff.succeeded(batch_id)
        self.poke()  # a slot is free
