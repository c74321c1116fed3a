"""Alerts, beside the calls (never on their path): the threshold checks that queue events in the
outbox, and the deliveries that send them (billing/alerts.py holds the tables).

:class:`Checker` runs every ``[alerts] check_interval``: for each webhook, each group it watches whose
balance is under its ``balance_below`` (``balance.low``, once until the balance is back above), each
live key expiring within its ``expiry_within`` (``key.expiring``, once per expiry), and the budget
windows a :class:`BudgetSource` reports at 50, 80 and 100 % (``budget.threshold``, once per window
and level). :class:`Deliverer` runs every ``deliver_interval``: it claims due events with a lease (the
webhooks in turn: billing/alerts.py), starts POSTing each signed body to its webhook with its own HTTP
session, and each send records its outcome: 2xx delivered; anything else is retried after
``backoff_base * 2**attempts`` seconds (at most ``backoff_max``), up to ``max_attempts``, then marked
failed. A round does not wait for its sends, and a webhook with a send in flight here gets no more
events until it ends: a receiver that hangs (at most ``timeout`` seconds a send) holds up only its
own webhook's events, never another group's, nor a call (so at most ``batch`` sends a webhook are in
flight, claimed together). A store that is down fails the round (the next one retries) or a send's
record (its lease runs out and the event is sent again: at least once, as webhooks are).

Where a webhook may point (core/destinations.py: public addresses, or what ``[alerts]
allow_destinations`` lists; never a cloud metadata service) is checked twice: when it is added
(:func:`refused`: the host resolved, every address checked) and at each send, where the session
connects only to the addresses its resolver (:class:`CheckedResolver`) let through, so a name that
resolves elsewhere by then (DNS rebinding) reaches nothing it may not. A send records only its outcome:
delivered, ``HTTP <status>``, or ``failed`` (a refused address, a connection that failed, a timeout:
the same word, so the deliveries API tells an admin nothing of the network behind a URL).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from billing import budgets
from billing.alerts import DELETED, EVENT_HEADER, SIGNATURE_HEADER, AlertBook, Delivery, Webhook, sign
from billing.store import Group, Store
from core.config import AlertsSettings
from core.destinations import Destinations, address_of, metadata_name
from core.money import to_credits

log = logging.getLogger("router.alerts")
BUDGET_LEVELS = (50, 80, 100)


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    """A budget window's state, as a budget implementation reports it: whose (``group``, and ``key_id``
    for a key's own budget), which window (its name and the start of the current one), used and limit
    in nano-credits."""

    group: str
    key_id: int | None
    window: str
    start: float
    used: int
    limit: int


BudgetSource = Callable[[], Awaitable[Sequence[BudgetWindow]]]


def budget_source(store: Store) -> BudgetSource:
    """The budgets of billing/budgets.py as the checker reads them: every budget's current window."""

    async def windows() -> list[BudgetWindow]:
        return [
            BudgetWindow(
                s.group_name, s.budget.key_id, s.budget.period.name, s.window_start, s.spent, s.budget.amount
            )
            for s in await budgets.states(store)
        ]

    return windows


class Checker:
    def __init__(self, store: Store, book: AlertBook) -> None:
        self.store = store
        self.book = book
        self.budgets: BudgetSource | None = None  # set by the budgets, when there are any

    async def check(self) -> int:
        """One round of checks; how many events it queued."""
        hooks = await self.book.webhooks()
        if not hooks:
            return 0
        queued = 0
        groups = await self.store.list_groups()
        longest = max((h.expiry_within or 0.0 for h in hooks), default=0.0)
        expiring = await self.book.expiring_keys(time.time() + longest) if longest else []
        windows = await self.budgets() if self.budgets is not None and any(h.budgets for h in hooks) else ()
        for hook in hooks:
            queued += await self._balances(hook, groups)
            queued += await self._expiries(hook, expiring)
            queued += await self._budgets(hook, windows)
        return queued

    @staticmethod
    def watches(hook: Webhook, group: str) -> bool:
        return hook.group is None or hook.group == group

    async def _balances(self, hook: Webhook, groups: Sequence[Group]) -> int:
        if hook.balance_below is None:
            return 0
        queued = 0
        for g in groups:
            name, balance = g.name, g.balance
            if not self.watches(hook, name):
                continue
            low = balance < hook.balance_below
            episode = await self.book.episode(f"balance:{hook.id}:{name}", low)
            if low:
                data = {
                    "group": name,
                    "balance": to_credits(balance),
                    "threshold": to_credits(hook.balance_below),
                }
                queued += await self.book.fire(
                    f"balance.low:{hook.id}:{name}:{episode}", hook.id, "balance.low", data
                )
        return queued

    async def _expiries(self, hook: Webhook, expiring: Sequence[tuple[int, str, str, float]]) -> int:
        if hook.expiry_within is None:
            return 0
        queued, horizon = 0, time.time() + hook.expiry_within
        for key_id, group, name, expires_at in expiring:
            if expires_at <= horizon and self.watches(hook, group):
                data = {"key_id": key_id, "key_name": name, "group": group, "expires_at": expires_at}
                event = f"key.expiring:{hook.id}:{key_id}:{expires_at!r}"
                queued += await self.book.fire(event, hook.id, "key.expiring", data)
        return queued

    async def _budgets(self, hook: Webhook, windows: Sequence[BudgetWindow]) -> int:
        queued = 0
        for w in windows if hook.budgets else ():
            if not self.watches(hook, w.group) or w.limit <= 0:
                continue
            percent = w.used * 100 // w.limit
            scope = f"key:{w.key_id}" if w.key_id is not None else f"group:{w.group}"
            for level in BUDGET_LEVELS:
                if percent >= level:
                    data = {
                        "group": w.group,
                        "key_id": w.key_id,
                        "window": w.window,
                        "window_start": w.start,
                        "level": level,
                        "used": to_credits(w.used),
                        "limit": to_credits(w.limit),
                    }
                    event = f"budget.threshold:{hook.id}:{scope}:{w.window}:{w.start!r}:{level}"
                    queued += await self.book.fire(event, hook.id, "budget.threshold", data)
        return queued


FAILED = "failed"  # a send that got no HTTP answer, whatever the reason
RESOLVE_SECONDS = 5.0  # a webhook's host, when it is added: resolved within this, or refused


def host_of(url: str) -> tuple[str, int] | None:
    """The host and port a webhook's URL connects to, as aiohttp reads it (None: no host)."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return None
    return (parsed.raw_host, parsed.port or 0) if parsed.raw_host else None


async def refused(url: str, allowed: Destinations) -> bool:
    """Whether a webhook may not point at ``url``: its host a cloud metadata name, an address that is
    not allowed, or a name that does not resolve or resolves to any address that is not allowed (an
    allow-listed name is not resolved: its addresses are checked at each send)."""
    target = host_of(url)
    if target is None:
        return True
    host, port = target
    if metadata_name(host):
        return True
    if address_of(host) is not None:
        return not allowed.permits(host, host)
    if allowed.trusts(host):
        return False
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_SECONDS
        )
    except (OSError, UnicodeError):  # (TimeoutError is an OSError)
        return True
    addresses = {str(info[4][0]) for info in infos}
    return not addresses or not all(allowed.permits(host, a) for a in addresses)


class CheckedResolver(AbstractResolver):
    """The addresses a webhook's host resolves to that it may be sent to (``allowed``); with none, an
    OSError: the session fails the send without a connection. (aiohttp resolves names only: a URL
    whose host is an address is checked by the deliverer before it sends.)"""

    def __init__(self, allowed: Destinations, inner: AbstractResolver | None = None) -> None:
        self.allowed = allowed
        self.inner = inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        kept = [r for r in found if self.allowed.permits(host, r["host"])]
        if not kept:
            raise OSError(f"{host}: no address a webhook may be sent to")
        return kept

    async def close(self) -> None:
        await self.inner.close()


class Deliverer:
    def __init__(self, book: AlertBook, settings: AlertsSettings) -> None:
        self.book = book
        self.settings = settings
        self.allowed = settings.destinations()  # (checked when the settings were read)
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._rounds = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._sending: dict[asyncio.Future[bool], int] = {}  # sends in flight -> their webhook

    def backoff(self, attempts: int) -> float:
        """Seconds before the next try, after ``attempts`` failed ones (1, 2, ...)."""
        return float(min(self.settings.backoff_base * 2 ** (attempts - 1), self.settings.backoff_max))

    async def deliver(self) -> int:
        """One round: claim due events and start sending them; how many were started (see the
        module's docstring: the round does not wait for them)."""
        if self.book.any_webhooks is None:
            await self.book.webhooks()
        if not self.book.any_webhooks:
            return 0  # no webhook (as of the last check): no look at the outbox
        owner = f"{self.replica}:{next(self._rounds)}"
        busy = set(self._sending.values())
        claimed = await self.book.claim(owner, self.settings.lease_seconds, self.settings.batch, busy)
        if not claimed:
            return 0
        hooks = {h.id: h for h in await self.book.webhooks()}
        if self._session is None:
            self._session = aiohttp.ClientSession(  # shared by every group's webhooks: keeps no cookies
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout),
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(
                    resolver=CheckedResolver(self.allowed)
                ),  # (no proxy: trust_env off)
            )
        for delivery in claimed:
            sending = asyncio.ensure_future(self._send(delivery, hooks.get(delivery.webhook_id), owner))
            self._sending[sending] = delivery.webhook_id
            sending.add_done_callback(self._sent)
        return len(claimed)

    def _sent(self, sending: asyncio.Future[bool]) -> None:
        self._sending.pop(sending, None)
        if not sending.cancelled() and sending.exception() is not None:  # its outcome could not be written
            log.warning(
                "webhook delivery: %s (the event is sent again once its lease runs out)", sending.exception()
            )

    async def idle(self) -> None:
        """Once every send in flight has ended."""
        while self._sending:
            await asyncio.wait(list(self._sending))

    async def _send(self, delivery: Delivery, hook: Webhook | None, owner: str) -> bool:
        if hook is None:
            await self.book.failed(delivery, owner, DELETED, None, None)
            return False
        body = delivery.body.encode()
        headers = {
            "content-type": "application/json",
            SIGNATURE_HEADER: sign(hook.secret, body),
            EVENT_HEADER: delivery.event_id,
            "user-agent": "model-router-webhooks",
        }
        status: int | None = None
        try:
            assert self._session is not None
            target = host_of(hook.url)
            host = target[0] if target is not None else ""
            if not host or (address_of(host) is not None and not self.allowed.permits(host, host)):
                # (a name: the resolver checks it)
                raise OSError(f"{host}: not an address a webhook may be sent to")
            async with self._session.post(
                hook.url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                status = answer.status
                await answer.read()
            if 200 <= status < 300:
                await self.book.delivered(delivery, owner, status)
                return True
            error = detail = f"HTTP {status}"
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            error, detail = (
                FAILED,
                f"{type(exc).__name__}: {exc}"[:300],
            )  # (the detail for the operator's log only)
        attempts = delivery.attempts + 1
        retry = time.time() + self.backoff(attempts) if attempts < self.settings.max_attempts else None
        await self.book.failed(delivery, owner, error, status, retry)
        log.info("webhook %s: event %s attempt %d failed (%s)", hook.id, delivery.event_id, attempts, detail)
        return False

    async def close(self) -> None:
        if self._sending:  # a second to end; then cancelled, as a round in progress is on stop: their
            # leases run out and another replica (or this one, started again) sends them again
            _, late = await asyncio.wait(list(self._sending), timeout=1.0)
            for future in late:
                future.cancel()
            if late:
                await asyncio.wait(late)
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
