"""Settlements that survive the store's faults (docs/operations.md, "Faults").

    settle ──► store ──ok──► durable
                 │ fails (connection lost, locked past the busy timeout, unreachable)
                 ▼
    retry: back-off 50 ms doubling to 1 s, a new connection each time, for ``give_up`` seconds
                 │ still failing
                 ▼
    journal: one JSON line, fsync'd (billing/journal.py) ──► replayed when the store answers again,
             and at the next start, each entry at most once (the store keeps its id)

The store hands a settlement whose first write failed to :meth:`Durable.rescue` (its
``Store.rescue`` hook) and the same future resolves once the retry or the journal has it: a
settlement that succeeds costs nothing more than before.

A retried settlement (:meth:`billing.store.Store.settle_again`) is applied only if it was not
already: on PostgreSQL a connection lost while its ``COMMIT`` was on the wire leaves the outcome
unknown, and the reservation row (deleted in the same transaction) says whether it committed. A
settlement the store refuses for what it is (:class:`billing.store.StoreError`: an unknown group)
is not retried: it fails as before and the ledger logs its record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from billing.journal import Entry, Journal, adopt, finish
from billing.store import Reservation, Store, StoreDown, StoreError, UsageRecord
from core import metrics

log = logging.getLogger("router.ledger")
RETRY_FIRST = 0.05  # seconds before the first retry; doubles each time
RETRY_MAX = 1.0
REPLAY_EVERY = 1.0  # while the journal has entries: seconds between tries (doubling to REPLAY_MAX)
REPLAY_MAX = 5.0


class Durable:
    """Settles through the store, retrying, then journaling (see the module's docstring)."""

    def __init__(self, store: Store, give_up: float = 5.0) -> None:
        self.store = store
        store.rescue = self.rescue
        self.give_up = give_up  # seconds from a settlement's submission before it goes to the journal
        self.journal: Journal | None = None
        self.retrying = 0  # settlements between a failed attempt and their outcome
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queued: list[tuple[Entry, asyncio.Future[int]]] = []  # for the journal's next write
        self._replayer: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self, journal: Journal | None) -> None:
        """Open ``journal`` and apply what it and other processes' abandoned journals hold."""
        self.journal = journal
        if journal is None:
            return
        journal.open()
        metrics.watch_journal(journal)
        try:
            for path in journal.orphans():
                adopted = adopt(path, journal.store)
                if adopted is not None:
                    entries, held = adopted
                    if entries:
                        log.warning("replaying %d settlements from the journal %s", len(entries), path)
                    done: set[str] = set()
                    try:
                        done = set(await self._apply(entries))
                    finally:
                        finish(path, held, done)  # the entries not done stay in that file
            await self.replay()
        except Exception as exc:  # the gateway still starts: its own journal is retried in the background
            log.error("the settlement journal could not be replayed at start (%r); retrying", exc)
            if journal.count and self._replayer is None:
                self._replayer = asyncio.get_running_loop().create_task(self._replay_until_empty())

    async def close(self) -> None:
        """Stop replaying (what is left stays in the journal for the next start)."""
        self._closing = True
        if self._replayer is not None:
            self._replayer.cancel()
            await asyncio.gather(self._replayer, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.journal is not None:
            self.journal.close()

    def rescue(
        self,
        reservation: Reservation,
        record: UsageRecord,
        began: float,
        future: asyncio.Future[int],
        error: BaseException,
        entry_id: str = "",
    ) -> bool:
        """:attr:`billing.store.Store.rescue`: take over a settlement whose first write failed (the
        store calls it; nothing is added to a settlement that succeeds). False: not retried (the store
        refused it for what it is), the future gets the error."""
        if isinstance(error, StoreError):
            return False
        metrics.store_error("settle")
        log.warning("a settlement could not be stored (%r); retrying", error)
        self.retrying += 1
        task = asyncio.get_running_loop().create_task(
            self._retry(future, reservation, record, began, error, entry_id)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _retry(
        self,
        outer: asyncio.Future[int],
        reservation: Reservation,
        record: UsageRecord,
        began: float,
        last: BaseException,
        entry_id: str = "",
    ) -> None:
        wait = RETRY_FIRST
        try:
            while time.monotonic() - began < self.give_up and not self._closing:
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MAX)
                try:
                    charge = await self.store.settle_again(reservation, record)
                except StoreError as exc:
                    outer.set_exception(exc)
                    return
                except Exception as exc:
                    metrics.store_error("settle")
                    log.debug("retried settlement failed: %r", exc)
                    last = exc
                    continue
                outer.set_result(charge)
                return
            self._to_journal(Entry.new(reservation, record, entry_id), outer, last)
        except asyncio.CancelledError:  # the loop is going away: the journal is the last resort
            self._to_journal(Entry.new(reservation, record, entry_id), outer, last)
            self._write_journal()
        finally:
            self.retrying -= 1

    def _to_journal(self, entry: Entry, outer: asyncio.Future[int], last: BaseException | None) -> None:
        if self.journal is None:
            outer.set_exception(
                StoreDown(f"the store stayed down ({last!r}) and there is no settlement journal")
            )
            return
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._write_journal)
        self._queued.append((entry, outer))

    def _write_journal(self) -> None:
        """One fsync'd write for the entries queued since the last one."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        assert self.journal is not None
        try:
            self.journal.append([entry for entry, _ in queued])
        except OSError as exc:
            for _, outer in queued:
                if not outer.done():
                    outer.set_exception(exc)
            return
        metrics.settlements_journaled(len(queued))
        log.warning(
            "the store is down: %d settlements written to the journal %s", len(queued), self.journal.path
        )
        for entry, outer in queued:
            if not outer.done():
                outer.set_result(entry.record.credits)
        if self._replayer is None and not self._closing:
            self._replayer = asyncio.get_running_loop().create_task(self._replay_until_empty())

    async def _replay_until_empty(self) -> None:
        wait = REPLAY_EVERY
        try:
            while self.journal is not None and self.journal.count:
                await asyncio.sleep(wait)
                try:
                    await self.replay()
                    wait = REPLAY_EVERY
                except Exception as exc:
                    wait = min(wait * 2, REPLAY_MAX)
                    log.info("the settlement journal could not be replayed yet: %r", exc)
        finally:
            self._replayer = None

    async def replay(self) -> int:
        """Apply this process's journal to the store; the number of entries it applied now."""
        if self.journal is None or not self.journal.count:
            return 0
        entries = self.journal.read()
        done = await self._apply(entries)
        self.journal.remove(set(done))
        return sum(done.values())

    async def _apply(self, entries: list[Entry]) -> dict[str, bool]:
        """Entries handled by the store (True: applied now; False: applied before, or refused)."""
        if not entries:
            return {}
        done = await self.store.replay(entries)
        applied = sum(done.values())
        metrics.journal_replayed(applied)
        log.warning(
            "replayed %d journaled settlements (%d already applied or refused)", applied, len(done) - applied
        )
        return done
