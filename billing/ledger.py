"""The credit ledger on top of a store: reserve the worst case before a call, settle the real cost
after it, exactly once, whatever happened in between (docs/operations.md, "Credits and billing").

    reserve ──► upstream call ──► settle(real cost)      (the rest of the reservation goes back)
       │ 402 if the group cannot afford the worst case; nothing is sent upstream
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from billing import budgets, rules, tokens
from billing.durable import Durable
from billing.journal import Journal
from billing.pricing import cost
from billing.progress import Progress, Source
from billing.store import Hold, Refusal, Reservation, Store, StoreDown, UsageRecord
from core import metrics
from core.catalog import Model
from core.errors import GatewayError, InsufficientCredits, StoreUnavailable
from core.flights import Flights
from core.money import to_credits
from core.wire import TokenUsage

log = logging.getLogger("router.ledger")


def refused(refusal: Refusal) -> InsufficientCredits:
    if refusal.reason == "budget":
        resets = budgets.iso(refusal.resets_at)
        return InsufficientCredits(
            f"Budget exceeded: the budget of {refusal.window} does not cover this call: it needs up to "
            f"{to_credits(refusal.needed)} credits and {to_credits(refusal.available)} are left in the window, which "
            f"resets at {resets}. Lower max_tokens, wait for the reset, or raise the budget.",
            code="budget_exceeded",
            headers={"x-budget-window": refusal.window, "x-budget-reset": resets},
        )
    if refusal.reason == "key_cap":
        return InsufficientCredits(
            f"This API key's spend cap does not cover this call: it needs up to {to_credits(refusal.needed)} "
            f"credits and the key has {to_credits(refusal.available)} left under its cap. Lower max_tokens or "
            "raise the key's cap.",
            code="key_spend_cap_reached",
        )
    return InsufficientCredits(
        f"Insufficient credits: this call needs up to {to_credits(refusal.needed)} credits (its worst case, "
        f"from max_tokens and the prompt) and the group's balance is {to_credits(refusal.available)}. "
        "Top up the group or lower max_tokens."
    )


class Ledger:
    """Reservations held in the store (PostgreSQL: atomic conditional updates shared by replicas).

    A call's answer does not wait for its settlement to be durable: the settlement is queued for the
    store's next group commit and the call's hold (its reservation) stays until that commit, so no
    other call can spend it meanwhile. Each settlement's future (``Meter.settled``) resolves once it
    is durable; the store commits them in the order they were queued, so :meth:`settled_so_far`
    waits for the last one queued. :meth:`watch` collects the settlements of one request id (a batch
    line, run in-process, waits for its own call's); :meth:`drain` (the gateway's shutdown) waits for
    every one. A settlement the store cannot take now is retried, then journaled (``durable``:
    billing/durable.py); one the store refuses for what it is (an unknown group) is logged with its
    usage record. While the store cannot take a reservation, :meth:`reserve` raises
    ``StoreUnavailable`` (503 ``store_unavailable``): nothing is sent upstream unreserved."""

    def __init__(
        self, store: Store, give_up: float = 5.0, reply_wait: float = 1.0, checkpoint: float = 1.0
    ) -> None:
        self.store = store
        self.durable = Durable(store, give_up)
        # how long a reply waits for its call's settlement to be durable (0: it does not wait); past it
        # (the store slow or down) the reply goes out and the settlement is retried, then journaled
        self.reply_wait = reply_wait
        # the streams in flight, their usage so far kept every few s
        self.progress = Progress(store, checkpoint)
        self.pending: set[asyncio.Future[int]] = set()  # settlements queued and not yet durable
        self.last: asyncio.Future[int] | None = None  # the settlement queued last
        self._watched: dict[str, list[asyncio.Future[int]]] = {}

    def queue(self, reservation: Reservation, record: UsageRecord) -> asyncio.Future[int]:
        """Settle without waiting (the store may batch it with others); the future resolves once it
        is durable."""
        return self._track(self.settle_soon(reservation, record, linger=True), record)

    def queue_reply(self, reservation: Reservation, record: UsageRecord) -> tuple[asyncio.Future[int], bool]:
        """Settle a call whose reply goes out next: the future, and whether the reply must wait for it
        (``reply_wait``). Where the store owes the settlement (billing/owed.py) it survives the process
        at once and lingers for a batch; else the reply waits for its commit, which then does not."""
        if not self.reply_wait:
            return self.queue(reservation, record), False
        owed = self.store.owes
        return self._track(self.settle_soon(reservation, record, linger=owed, owed=owed), record), not owed

    def record(self, record: UsageRecord) -> asyncio.Future[int]:
        """Store the record of a call refused before anything was reserved (status ``rejected``), as a
        settlement of nothing: no charge, queued and tracked like any other."""
        nothing = Reservation(0, record.group_id, record.key_id, 0)
        return self._track(self.store.settle_soon(nothing, record, linger=True), record)

    def _track(self, settling: asyncio.Future[int], record: UsageRecord) -> asyncio.Future[int]:
        self.pending.add(settling)
        self.last = settling
        settling.add_done_callback(partial(self._settled, record))
        if self._watched and record.request_id in self._watched:
            self._watched[record.request_id].append(settling)
        return settling

    def _settled(self, record: UsageRecord, done: asyncio.Future[int]) -> None:
        self.pending.discard(done)
        error = "cancelled" if done.cancelled() else done.exception()
        if error is not None:  # the charge is lost: its record goes to the log, to be put right by hand
            log.error("a settlement could not be stored (%r): %r", error, record)

    def watch(self, request_id: str) -> None:
        """From now until :meth:`unwatch`, collect the settlements of calls with this request id."""
        self._watched.setdefault(request_id, [])

    def unwatch(self, request_id: str) -> list[asyncio.Future[int]]:
        """Stop collecting; the settlements collected since :meth:`watch`."""
        return self._watched.pop(request_id, [])

    async def settled_so_far(self) -> None:
        """Wait until every settlement queued so far is durable (or failed)."""
        last = self.last
        if last is not None and not last.done():
            await asyncio.wait((last,))

    async def drain(self) -> None:
        """Wait until every settlement queued so far is durable (or failed)."""
        if self.pending:
            await asyncio.wait(set(self.pending))

    async def start(self, journal: Journal | None) -> None:
        """Open the settlement journal and replay what it holds, then charge the streams a stopped
        process left in progress (the gateway's start)."""
        metrics.watch_ledger(self)
        await self.durable.start(journal)
        try:
            await self.store.recover_stopped()
        except StoreDown as exc:  # what it left stays: settled at the next start
            log.error("what a stopped process left could not be settled now: %s", exc)

    async def close(self) -> None:
        await self.durable.close()

    async def reserve(self, group_id: int, key_id: int, amount: int, hold: Hold | None = None) -> Reservation:
        """``hold``: what a replica's crash would leave to record (the store keeps it with the hold)."""
        try:
            result = await self.store.reserve(group_id, key_id, amount, hold)
        except StoreDown as exc:
            metrics.store_error("reserve")
            log.warning("a reservation could not be made: %s", exc)
            raise StoreUnavailable() from None
        if isinstance(result, Refusal):
            raise refused(result)
        return result

    def settle_soon(
        self, reservation: Reservation, record: UsageRecord, linger: bool = False, owed: bool = False
    ) -> asyncio.Future[int]:
        """Start settling now (nothing can cancel it); the future resolves once it is durable.
        ``linger``: nobody waits for it (a store may then wait a little to batch it with others);
        ``owed``: see :meth:`billing.store.Store.settle_soon`."""
        # kept until durable: billing/durable.py
        return self.store.settle_soon(reservation, record, linger, owed)


def ledger_for(
    store: Store, give_up: float = 5.0, reply_wait: float = 1.0, checkpoint: float = 1.0
) -> Ledger:
    """The ledger for a store: held in this process's memory if it alone spends from the store
    (SQLite), else in the store itself (PostgreSQL: reservations shared by the replicas). ``give_up``:
    seconds a settlement is retried before it goes to the journal; ``reply_wait``: see :class:`Ledger`;
    ``checkpoint``: seconds between checkpoints of the streams in flight (billing/progress.py)."""
    if store.exclusive:
        return LocalLedger(store, give_up=give_up, reply_wait=reply_wait, checkpoint=checkpoint)
    return Ledger(store, give_up, reply_wait, checkpoint)


@dataclass(slots=True)
class _Holds:
    limit: int | None  # the group's committed balance / the key's cap minus its committed spend
    held: int = 0  # worst cases of calls in flight
    read_at: float = 0.0


class LocalLedger(Ledger):
    """Reservations held in this process's memory, for a store that this process alone spends from
    (SQLite: one gateway per database file, which ``Gateway.start`` enforces with a file lock).

    Admission costs no store round trip: a group's committed balance (and a key's room under its
    cap) is read from the store at most every ``refresh`` seconds — and again before any refusal, so
    a top-up by the CLI or the console is seen at once — and the worst cases of calls in flight are
    held against it here. Settling charges the store durably (group commit) and only then lets go of
    the hold. Nothing is ever reserved in the store, so a crash leaves nothing to reconcile: the
    balance is exactly what was charged."""

    def __init__(
        self,
        store: Store,
        refresh: float = 2.0,
        give_up: float = 5.0,
        reply_wait: float = 1.0,
        checkpoint: float = 1.0,
    ) -> None:
        super().__init__(store, give_up, reply_wait, checkpoint)
        self.refresh = refresh
        self._groups: dict[int, _Holds] = {}
        self._keys: dict[int, _Holds] = {}
        self._windows: dict[int, budgets.Windows] = {}  # group id -> its and its keys' budgets, if any
        self._released = 0  # settlements durable so far
        self._ids = itertools.count(-1, -1)
        self._reads: Flights[tuple[_Holds, _Holds]] = Flights()

    async def _read(self, group_id: int, key_id: int) -> tuple[_Holds, _Holds]:
        # read again if a settlement became durable meanwhile (seen by one read, not the other)
        for _ in range(8):
            released = self._released
            balance, room = await self.store.ledger_state(group_id, key_id)
            windows = await budgets.read(self.store.database, [group_id], self.store.clock())
            if self._released == released:
                break
        older = self._windows.get(group_id)
        if older is not None:
            windows.keep(older)  # (the view has every charge made durable: a raced read never lowers it)
        now = time.monotonic()
        group = self._groups.setdefault(group_id, _Holds(balance))
        key = self._keys.setdefault(key_id, _Holds(room))
        group.limit, group.read_at = balance, now
        key.limit, key.read_at = room, now
        if windows:
            self._windows[group_id] = windows
        else:
            self._windows.pop(group_id, None)
        return group, key

    async def _reread(self, group_id: int, key_id: int) -> tuple[_Holds, _Holds]:
        """A read that starts now, shared with the calls that ask for it meanwhile (core/flights.py):
        a burst, or a flood of calls refused for want of credit, reads the store once or twice."""
        try:
            return await self._reads.fresh((group_id, key_id), lambda: self._read(group_id, key_id))
        except StoreDown as exc:
            metrics.store_error("reserve")
            log.warning("the ledger's balance could not be read: %s", exc)
            raise StoreUnavailable() from None

    def _refusal(
        self, group: _Holds, key: _Holds, amount: int, group_id: int = 0, key_id: int = 0
    ) -> Refusal | None:
        windows = self._windows.get(group_id) if self._windows else None
        over = None
        if windows is not None:  # every call's worst case held against every window (billing/budgets.py)
            windows.now = self.store.clock()
            over = partial(windows.check, group_id, key_id, group.held, key.held, amount)
        assert group.limit is not None
        key_room = key.limit - key.held if key.limit is not None else None
        return rules.refusal(amount, key_room, over, group.limit - group.held)

    async def reserve(self, group_id: int, key_id: int, amount: int, hold: Hold | None = None) -> Reservation:
        group, key = self._groups.get(group_id), self._keys.get(key_id)
        now = time.monotonic()
        if (
            group is None
            or key is None
            or now - group.read_at > self.refresh
            or now - key.read_at > self.refresh
        ):
            group, key = await self._reread(group_id, key_id)
        elif now - group.read_at > self.refresh / 2 or now - key.read_at > self.refresh / 2:
            # read again ahead of time, waited for by nobody: under another group's burst the read
            # queues behind its store work, and this group's calls must not queue with it
            self._reads.ahead((group_id, key_id), lambda: self._read(group_id, key_id))
        refusal = self._refusal(group, key, amount, group_id, key_id)
        if refusal is not None:
            group, key = await self._reread(group_id, key_id)  # a top-up may have come since
            refusal = self._refusal(group, key, amount, group_id, key_id)
            if refusal is not None:
                raise refused(refusal)
        group.held += amount
        key.held += amount
        return Reservation(next(self._ids), group_id, key_id, amount)

    def settle_soon(
        self, reservation: Reservation, record: UsageRecord, linger: bool = False, owed: bool = False
    ) -> asyncio.Future[int]:
        settled = self.store.settle_soon(reservation, record, linger, owed)

        def release(done: asyncio.Future[int]) -> None:
            charge = 0 if done.cancelled() or done.exception() is not None else done.result()
            self._released += 1
            group, key = self._groups[reservation.group_id], self._keys[reservation.key_id]
            group.held -= reservation.amount
            key.held -= reservation.amount
            if group.limit is not None:
                group.limit -= charge
            if key.limit is not None:
                key.limit -= charge
            windows = self._windows.get(reservation.group_id) if self._windows else None
            if windows is not None:
                windows.now = self.store.clock()
                windows.charge(reservation.group_id, reservation.key_id, charge)

        settled.add_done_callback(release)
        return settled


@dataclass(slots=True)
class Meter:
    """Settles one call exactly once: its usage record and its charge."""

    ledger: Ledger
    reservation: Reservation
    model: Model
    record: UsageRecord
    prompt: dict[str, Any]  # the chat request (messages, tools, response_format), to estimate a prompt
    # whose usage the upstream never gave
    started: float = field(default_factory=time.monotonic)
    finished: bool = False
    settled: asyncio.Future[int] | None = None  # once finished: resolves when its settlement is durable
    waits: bool = False  # its reply waits for that (:meth:`durable`)
    on_finish: Callable[[], None] | None = None  # told once the call is over (the deployment's lease)
    # told its record, filled, and its settlement's future (the call's trace: gateway/tracing.py)
    on_record: Callable[[UsageRecord, asyncio.Future[int]], None] | None = None

    def settles_on_failure(self) -> _SettlesOnFailure:
        """Around a step of the call (``async with``): if it fails, settle at once — ``error`` for a
        gateway error, ``interrupted`` if cancelled or a bug — so the reservation is released, then
        re-raise."""
        return _SettlesOnFailure(self)

    async def finish(
        self,
        usage: TokenUsage | None,
        status: str,
        *,
        generated: str = "",
        error: str | None = None,
        first_token_at: float | None = None,
        upstream_id: str | None = None,
        prompt_usage: TokenUsage | None = None,
        estimated: bool = False,
        reply: bool = False,
    ) -> None:
        """``prompt_usage``: the prompt's exact counts, when the upstream gave them before it stopped
        (Anthropic's ``message_start``); an estimate then counts only the output. ``reply``: the
        caller's answer goes out after :meth:`durable` (its settlement is written at once, not
        lingered for a batch)."""
        if self.finished:
            return
        self.finished = True
        self.ledger.progress.drop(self.reservation)
        if self.on_finish is not None:
            self.on_finish()
        record = self.record
        exact = usage is not None and not estimated
        if usage is None and (generated or status == "interrupted"):
            usage = await asyncio.get_running_loop().run_in_executor(
                None, self._estimate, generated, prompt_usage
            )
        if usage is None:
            usage = TokenUsage()  # failed before the provider produced anything: costs nothing
        record.prompt_tokens = usage.prompt
        record.completion_tokens = usage.completion
        record.cached_tokens = usage.cached
        record.cache_write_tokens = usage.cache_write
        record.reasoning_tokens = usage.reasoning
        # never more than the worst case reserved for it (an upstream that overran its output cap):
        # what was reserved is what every limit — balance, key cap, budget windows — was checked against
        record.credits = min(cost(self.model.prices, usage), self.reservation.amount)
        record.status = status
        record.usage_exact = exact
        record.error = error
        record.upstream_request_id = upstream_id
        now = time.monotonic()
        record.latency_ms = (now - self.started) * 1000
        record.ttft_ms = (first_token_at - self.started) * 1000 if first_token_at else None
        record.ts = time.time()
        metrics.call_settled(record)
        # durable at the store's next group commit (see Ledger); a reply goes out once it survives the process
        if reply:
            self.settled, self.waits = self.ledger.queue_reply(self.reservation, record)
        else:
            self.settled = self.ledger.queue(self.reservation, record)
        if self.on_record is not None:
            self.on_record(record, self.settled)

    def follow(self, source: Source) -> None:
        """This call streams: its usage so far, as ``source`` tells it, is kept in the store every few
        seconds until it settles, so a crash still charges what it generated (billing/progress.py)."""
        self.ledger.progress.follow(self, source)

    async def durable(self) -> None:
        """Wait until this call's settlement survives the process, at most the ledger's ``reply_wait``:
        the caller's last byte goes out after it, so a call the caller saw complete is charged even if
        the process dies the next instant. SQLite: at once (its owed log has it: billing/owed.py);
        PostgreSQL: its commit. Past the wait (the store slow or down) the reply goes out and the
        settlement goes on being retried, then journaled (billing/durable.py)."""
        settled = self.settled
        if self.waits and settled is not None and not settled.done():
            await asyncio.wait((settled,), timeout=self.ledger.reply_wait)

    def _estimate(self, generated: str, prompt: TokenUsage | None) -> TokenUsage:
        completion = tokens.count(generated)
        if prompt is not None:
            return TokenUsage(
                prompt=prompt.prompt,
                cached=prompt.cached,
                cache_write=prompt.cache_write,
                completion=completion,
            )
        return TokenUsage(prompt=tokens.count_request(self.prompt), completion=completion)


class _SettlesOnFailure:
    """:meth:`Meter.settles_on_failure` (a class, not ``contextlib.asynccontextmanager``: it is on
    every call's path twice, and a generator-based one costs several times more)."""

    __slots__ = ("meter",)

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, GatewayError):
            self.meter.record.error_code = exc.code or exc.type
            await self.meter.finish(None, "error", error=exc.message)
        else:
            await self.meter.finish(None, "interrupted", error="the call did not complete")
