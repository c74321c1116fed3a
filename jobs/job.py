"""The run of one batch, by the runner that holds its lease.

    validating   read the input file, check every line (jobs/validate.py) → in_progress, or failed
    in_progress  lines in flight when a previous runner died are failed (never run twice); then up to
                 ``concurrency`` workers each claim a line (durably), call the app, record the result
    finalizing   output and error files are written, then completed
    cancelling   lines in flight finish; the rest are failed with ``batch_cancelled``; then cancelled
    (deadline)   past ``expires_at`` the rest are failed with ``batch_expired``; then expired

A batch asked to yield its slot to another group's (jobs/runner.py) claims no more lines, lets those in
flight finish and lets its lease go, still ``in_progress``; whoever claims it next goes on from there.

Every write is conditional on holding the lease. A runner that loses its lease (another replica took
the batch after it went silent) stops claiming lines at once; its late results are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from billing.store import Principal
from core.types import ASGIApp, Endpoint
from core.wire import ChatRequest
from gateway.context import CallContext
from gateway.pipeline import Pipeline
from gateway.reliability import backoff
from jobs.calls import call_app, error_line, output_line, request_id
from jobs.store import BatchRow, FileRow, Final, JobStore, Line, Outcome, new_file_id
from jobs.validate import ENDPOINTS, Check, Problem, parse_input

if TYPE_CHECKING:
    from core.config import JobsSettings
    from gateway.state import Gateway

log = logging.getLogger("router.jobs")

INTERRUPTED = (
    "The gateway stopped while this request was in flight. It is not run again (a batch line runs at most "
    "once) and may or may not have reached the provider; submit it again if you need it."
)
RATE_LIMIT_RETRIES = 3  # a 429 means the request was not run: wait and try again, this many times


class Runner(Protocol):
    """What a job reads of the runner that runs it (``jobs.runner.JobRunner``)."""

    @property
    def gw(self) -> Gateway: ...

    @property
    def app(self) -> ASGIApp: ...

    @property
    def settings(self) -> JobsSettings: ...

    @property
    def store(self) -> JobStore: ...

    @property
    def stopping(self) -> bool: ...


class Job:
    def __init__(self, runner: Runner, batch: BatchRow, owner: str) -> None:
        self.runner = runner
        self.store = runner.store
        self.batch = batch
        self.owner = owner
        self.stopping = False  # the runner is shutting down: claim nothing more
        self.yielding = False  # another group's batch waits for this one's slot: claim nothing more, let go
        self.lost = False  # the lease is no longer ours
        self.principal: Principal | None = None
        self.crashed = False  # the run raised: the runner backs off before taking this batch up again

    @property
    def halted(self) -> bool:
        return self.stopping or self.lost or self.runner.stopping

    async def run(self) -> None:
        keeper = asyncio.create_task(self._keep_lease())
        done = False
        try:
            done = await self._run()
        except Exception:
            self.crashed = True
            log.exception("batch %s: the run failed; it is taken up again after a back-off", self.batch.id)
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            if not done:
                try:
                    await asyncio.shield(self.store.release(self.batch.id, self.owner))
                except Exception:
                    log.warning("batch %s: could not release the lease", self.batch.id)

    async def _run(self) -> bool:
        """True when the batch reached its final status."""
        b, store = self.batch, self.store
        self.principal = await store.principal_by_id(b.key_id)
        status = b.status
        if status == "validating":
            if not await self.validate():
                return True
            current = await store.get_batch(None, b.id)
            status = current.status if current else ""
        if status in ("in_progress", "cancelling"):
            await self.recover()
        if status == "in_progress":
            await self.execute()
        if self.halted or self.yielding:
            return False
        return await self.conclude()

    # -- validating ------------------------------------------------------------------------------------
    async def validate(self) -> bool:
        """The input file's lines into the store (→ in_progress); False when the batch failed."""
        b, now = self.batch, int(time.time())
        data = await self.store.file_content(b.group_id, b.input_file_id)
        if data is None:
            problems = [Problem("file_not_found", f"The input file {b.input_file_id} no longer exists.")]
            lines: list[Line] = []
        elif self.principal is None:
            problems = [Problem("invalid_api_key", "The API key that created this batch has been revoked.")]
            lines = []
        else:
            settings = self.runner.gw.settings
            try:
                lines, problems = await asyncio.to_thread(
                    parse_input,
                    data,
                    b.endpoint,
                    self.model_check(self.principal),
                    max_lines=settings.jobs.max_lines,
                    max_body_bytes=settings.server.max_body_bytes,
                )
            except (
                Exception
            ) as exc:  # a bug of ours on this file: fail the batch once, do not retry it for ever
                log.exception("batch %s: its input file could not be validated", b.id)
                problems = [
                    Problem("invalid_file", f"The input file could not be validated ({type(exc).__name__}).")
                ]
                lines = []
        if problems:
            await self.store.fail_batch(b.id, self.owner, [p.data() for p in problems], now)
            log.info("batch %s failed validation (%d errors)", b.id, len(problems))
            return False
        if not await self.store.start_batch(b.id, self.owner, lines, now):
            self.lost = True
            return False
        log.info("batch %s: %d requests validated", b.id, len(lines))
        return True

    def model_check(self, principal: Principal) -> Check:
        """The checks a call makes before it reserves: model, endpoint, images, output ceiling, allow-list."""
        pipeline = Pipeline(self.runner.gw)

        def check(request: ChatRequest, kind: Endpoint) -> None:
            pipeline.check(principal, request, kind)

        return check

    # -- in_progress -----------------------------------------------------------------------------------
    async def recover(self) -> None:
        """Lines claimed by a runner that is gone: failed, not run again (at most once)."""
        for line in await self.store.running_lines(self.batch.id):
            outcome = error_line(line.custom_id, "interrupted", INTERRUPTED)
            await self.store.finish_line(self.batch.id, line.line_no, None, outcome, time.time())
            log.warning(
                "batch %s: line %d was in flight when its runner stopped; failed", self.batch.id, line.line_no
            )

    async def execute(self) -> None:
        workers = min(self.runner.settings.concurrency, max(self.batch.total, 1))
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(self.worker())

    async def worker(self) -> None:
        b, store = self.batch, self.store
        while not self.halted and not self.yielding and time.time() < b.expires_at:
            line = await store.claim_line(b.id, self.owner, time.time())
            if line is None:
                return
            settlements: list[asyncio.Future[int]] = []
            try:
                outcome = await self.call(line, settlements)
            except asyncio.CancelledError:  # shutting down past the grace period
                outcome = error_line(line.custom_id, "interrupted", INTERRUPTED)
                await store.finish_line(b.id, line.line_no, self.owner, outcome, time.time())
                raise
            except Exception:
                log.exception("batch %s: line %d", b.id, line.line_no)
                outcome = error_line(
                    line.custom_id, "internal_error", "The gateway failed to run this request.", 500
                )
            # the call's settlement is durable before the line is: a line in the output is a line billed,
            # also when the process is killed right after (API answers do not wait: billing/ledger.py)
            if settlements:
                await asyncio.wait(settlements)
            await store.finish_line(b.id, line.line_no, self.owner, outcome, time.time())

    async def call(self, line: Line, settlements: list[asyncio.Future[int]]) -> Outcome:
        """The line's call (a 429 tried again); the settlements of its attempts go to ``settlements``."""
        principal = self.principal
        if principal is None:
            return error_line(
                line.custom_id,
                "invalid_api_key",
                "The API key that created this batch has been revoked; its remaining requests are not run.",
                401,
            )
        body = line.body.encode()
        timeout = self.runner.settings.line_timeout
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            rid = request_id()
            ledger = self.runner.gw.ledger
            ledger.watch(rid)
            try:
                async with asyncio.timeout(timeout):
                    context = CallContext(
                        principal, rid, "job", ENDPOINTS[self.batch.endpoint], self.batch.id
                    )
                    answer = await call_app(self.runner.app, self.batch.endpoint, body, context)
            except TimeoutError:
                return error_line(
                    line.custom_id, "timeout", f"The request took longer than {timeout:g} s.", 504, rid
                )
            finally:
                settlements += ledger.unwatch(rid)
            if answer.status != 429 or answer.headers.get("x-should-retry") == "false":
                break  # (a 429 no wait cures says so: a call too large for the provider's account)
            if attempt == RATE_LIMIT_RETRIES or self.halted:
                break
            rel = self.runner.gw.settings.reliability
            wait = backoff(attempt, rel.backoff_base, rel.backoff_max, answer.headers.get("retry-after"))
            await asyncio.sleep(min(wait, 30.0))
        return output_line(line.custom_id, rid, answer)

    async def _keep_lease(self) -> None:
        lease = self.runner.settings.lease_seconds
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(lease / 3)
            try:
                status = await self.store.renew(self.batch.id, self.owner, lease)
                self.principal = await self.store.principal_by_id(self.batch.key_id)
            except Exception as exc:
                log.warning("batch %s: lease renewal failed (%s)", self.batch.id, exc)
                if time.monotonic() - renewed > lease:
                    self.lost = True
                    return
                continue
            if status is None:
                log.warning("batch %s: lease lost; this runner stops", self.batch.id)
                self.lost = True
                return
            renewed = time.monotonic()

    # -- the end ---------------------------------------------------------------------------------------
    async def conclude(self) -> bool:
        b, store = self.batch, self.store
        current = await store.get_batch(None, b.id)
        if current is None or current.lease_owner != self.owner:
            self.lost = True
            return False
        states = await store.line_states(b.id)
        unfinished = any(s.state in ("pending", "running") for s in states)
        if current.status == "cancelling":
            final = "cancelled"
        elif unfinished and time.time() >= b.expires_at:
            final = "expired"
        elif unfinished:
            return False  # not ours to finish now (taken up again)
        else:
            final = "completed"
            if current.status == "in_progress":
                await store.set_finalizing(b.id, self.owner, int(time.time()))
        code, message = {
            "cancelled": ("batch_cancelled", "The batch was cancelled before this request ran."),
            "expired": (
                "batch_expired",
                "This request could not be executed before the completion window expired.",
            ),
        }.get(final, ("interrupted", INTERRUPTED))
        out: list[str] = []
        err: list[str] = []
        for s in states:
            if s.state == "done" and s.result is not None:
                out.append(s.result)
            elif s.state == "failed" and s.result is not None:
                err.append(s.result)
            else:
                err.append(error_line(s.custom_id, code, message).result)
        now = int(time.time())
        output, out_data = self._file(out, "output", now)
        error, err_data = self._file(err, "error", now)
        done = await store.finalize(
            b.id, self.owner, Final(final, now, len(out), len(err), output, out_data, error, err_data)
        )
        if done:
            log.info("batch %s %s: %d completed, %d failed", b.id, final, len(out), len(err))
        return done

    def _file(self, lines: list[str], kind: str, now: int) -> tuple[FileRow | None, bytes]:
        if not lines:
            return None, b""
        data = ("\n".join(lines) + "\n").encode()
        b = self.batch
        return FileRow(
            new_file_id(), b.group_id, b.key_id, "batch_output", f"{b.id}_{kind}.jsonl", len(data), now
        ), data
