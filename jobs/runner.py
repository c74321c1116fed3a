"""The background runner inside the gateway process: claims open batches and runs them (jobs/job.py).

One loop per process looks for work every ``poll_interval`` seconds (at once when a batch is created
or cancelled here) and runs up to ``max_jobs`` batches at a time. A batch is run by the process that
holds its lease (owner and expiry in the batch row, renewed while it runs), so with several replicas on
one PostgreSQL each batch has one runner at a time; a replica that dies leaves its batches to the
others once their leases run out. On SQLite (one gateway per database file) every lease left in the
file is from a process that is gone, so they are all let go on start: a restart resumes at once.

On shutdown the runner stops claiming lines, gives the lines in flight ``stop_grace`` seconds to
finish, then cancels them (they are failed as interrupted, never run again) and lets its leases go.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING

from core.types import ASGIApp
from jobs.job import Job
from jobs.store import JobStore, open_job_store

if TYPE_CHECKING:
    from gateway.state import Gateway

log = logging.getLogger("router.jobs")


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
        self.stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.Task[None] | None = None

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

    def poke(self) -> None:
        """There may be new work (a batch created or cancelled here): look now."""
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        self.stopping = True
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
            batch = await self.store.claim_batch(owner, self.settings.lease_seconds, list(self.jobs))
            if batch is None:
                return
            job = Job(self, batch, owner)
            task = asyncio.create_task(job.run(), name=f"batch-{batch.id}")
            self.jobs[batch.id] = (job, task)
            task.add_done_callback(partial(self._done, batch.id))

    def _done(self, batch_id: str, _task: object = None) -> None:
        self.jobs.pop(batch_id, None)
        self.poke()  # a slot is free
