"""Background responses (``POST /v1/responses`` with ``background: true``), run by the job runner's
process (jobs/runner.py starts and stops this beside the batches), and the purge of expired responses.

A queued response (gateway/response_store.py) is claimed under a lease, ``in_progress`` written before
its call goes upstream, and run as one in-process call to the gateway's own app (jobs/calls.py), so it
goes through the same path as a foreground call: the pipeline, the ledger, billed with ``source=api``
exactly as if its caller had waited; the endpoint stores the outcome under the queued id. A call that
answers with an error fails the response with that error. The lease is renewed every third of
``[jobs] lease_seconds`` while it runs; a response cancelled meanwhile (by any replica) has its call
stopped at the next renewal, at once when it runs here (``cancel``): the call settles as interrupted,
billed for what was generated.

Groups share the places: a claim gives each free place to the group with the fewest background
responses running (by any replica), its oldest queued one (``ResponseStore.claim``).

At most once: a response left ``in_progress`` by a process that died (its lease ran out; on SQLite,
every one left at start) is failed, never run again, so no call is billed twice. Queued ones wait for
the next process: they survive a restart. On shutdown the calls in flight get ``[jobs] stop_grace``
seconds, then are cancelled and failed as interrupted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from functools import partial
from typing import Any

import msgspec

from billing.store import Principal
from core.types import ASGIApp
from gateway.context import CallContext
from gateway.response_store import ResponseStore
from gateway.state import Gateway
from jobs.calls import call_app, request_id

log = logging.getLogger("router.jobs")
_decode = msgspec.json.Decoder().decode

INTERRUPTED = {
    "code": "server_error",
    "message": "The gateway process running this background response stopped before it ended; it was "
    "not run again (nothing is billed twice). Create it again.",
}
REVOKED = {"code": "invalid_api_key", "message": "The key that created this background response was revoked."}


def error_of(status: int, body: bytes) -> dict[str, Any]:
    """The ``error`` of a response whose call answered ``status`` with ``body``."""
    try:
        error = _decode(body).get("error") if body else None
    except (msgspec.DecodeError, AttributeError):
        error = None
    error = error if isinstance(error, dict) else {}
    return {
        "code": str(error.get("code") or error.get("type") or f"http_{status}"),
        "message": str(error.get("message") or f"The call failed with HTTP status {status}."),
    }


class Background:
    def __init__(
        self,
        gateway: Gateway,
        app: ASGIApp,
        name: str,
        principal: Callable[[int], Awaitable[Principal | None]],
    ) -> None:
        self.gw = gateway
        self.app = app
        self.name = name
        self.principal = principal  # a key's principal by its id (jobs.store.JobStore.principal_by_id)
        self.store: ResponseStore = gateway.responses
        jobs = gateway.settings.jobs
        self.lease, self.grace = jobs.lease_seconds, jobs.stop_grace
        self.every = min(jobs.poll_interval, jobs.lease_seconds / 3)
        self.running: dict[str, tuple[str, asyncio.Task[None]]] = {}  # response id → (lease owner, its task)
        self._claims = itertools.count(1)
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self.stopping = False

    async def start(self, exclusive: bool) -> None:
        """``exclusive``: no other process runs this store's responses (SQLite): every one left
        ``in_progress`` is a dead process's."""
        self.stopping = False
        if exclusive:
            with suppress(Exception):  # the store is down: the loop fails them once their lease ran out
                await self._fail_orphans(every=True)
        self._loops = [
            asyncio.create_task(self._run(), name="background-responses"),
            asyncio.create_task(self._purge(), name="responses-purge"),
        ]

    def poke(self) -> None:
        self._wake.set()

    def cancel(self, response_id: str) -> None:
        """Stop the call of a response cancelled (or deleted) here, if this process runs it."""
        found = self.running.get(response_id)
        if found is not None:
            found[1].cancel()

    async def stop(self) -> None:
        self.stopping = True
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        tasks = [task for _, task in self.running.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _run(self) -> None:
        while not self.stopping:
            self._wake.clear()
            try:
                for response_id in await self.store.renew(
                    [owner for owner, _ in self.running.values()], self.lease
                ):
                    self.cancel(response_id)
                await self._fail_orphans()
                await self._claim()
            except Exception as exc:  # the store is unreachable, say: try again later
                log.warning("background responses: could not look for work (%s)", exc)
            with suppress(TimeoutError):
                async with asyncio.timeout(self.every):
                    await self._wake.wait()

    async def _fail_orphans(self, every: bool = False) -> None:
        for response_id in await self.store.orphans(every):
            if response_id not in self.running and await self.store.fail(
                response_id, INTERRUPTED, ("in_progress",)
            ):
                log.warning(
                    "background response %s was left running by a stopped process: failed", response_id
                )

    async def _claim(self) -> None:
        free = self.gw.settings.responses.background_concurrency - len(self.running)
        if free <= 0 or self.stopping:
            return
        owner = f"{self.name}:r{next(self._claims)}"
        for response_id, key_id, request in await self.store.claim(owner, self.lease, free):
            task = asyncio.create_task(
                self._one(response_id, key_id, request), name=f"response-{response_id}"
            )
            self.running[response_id] = (owner, task)
            task.add_done_callback(partial(self._done, response_id))

    def _done(self, response_id: str, _task: object = None) -> None:
        self.running.pop(response_id, None)
        self.poke()  # a slot is free

    async def _one(self, response_id: str, key_id: int, request: bytes) -> None:
        try:
            principal = await self.principal(key_id)
            if principal is None:
                await self.store.fail(response_id, REVOKED)
                return
            context = CallContext(principal, request_id(), "api", "responses", response_id=response_id)
            answer = await call_app(self.app, "/v1/responses", request, context)
            if answer.status != 200:
                await self.store.fail(response_id, error_of(answer.status, answer.body))
        except asyncio.CancelledError:
            if self.stopping:  # (a cancel by the caller left it cancelled already)
                await asyncio.shield(self._fail_quietly(response_id, INTERRUPTED))
            raise
        except Exception as exc:  # a bug, the store: the response must not stay in_progress for ever
            log.exception("background response %s failed", response_id)
            await self._fail_quietly(
                response_id, {"code": "server_error", "message": f"{type(exc).__name__}"}
            )

    async def _fail_quietly(self, response_id: str, error: dict[str, Any]) -> None:
        try:
            await self.store.fail(response_id, error)
        except Exception as exc:  # its lease runs out: failed by whoever looks next
            log.warning("background response %s: could not record its failure (%s)", response_id, exc)

    async def _purge(self) -> None:
        interval = self.gw.settings.responses.purge_interval
        while not self.stopping:
            try:
                purged = await self.store.purge()
                if purged:
                    log.info("purged %d expired stored response(s)", purged)
            except Exception as exc:
                log.warning("stored responses: the purge failed (%s); retried in %.0f s", exc, interval)
            await asyncio.sleep(interval)
