"""Alerts' durable state, on the store's database handle: the webhooks an operator configured, the
outbox of events to deliver to them, and the arming of the balance thresholds.

An event is a row of ``alert_outbox`` whose ``event_id`` names its condition and window
(``balance.low:<webhook>:<group>:<episode>``, ``key.expiring:<webhook>:<key>:<expires_at>``,
``budget.threshold:<webhook>:<scope>:<window>:<start>:<percent>``): inserted with ON CONFLICT DO
NOTHING, so each event is queued once per window whichever replica sees it first. A balance alert is
re-armed (its episode moves on) once the balance is back at or above the threshold.

Deliveries are claimed with a lease (``lease_owner``, ``lease_until``), as the batch runner claims
jobs: a replica sets both on a few due rows whose lease is free or run out, in one statement that
re-checks the lease on each row, so two replicas never hold the same event; a replica that dies
holding some leaves them to another one when the lease runs out. A claim takes the webhooks in turn
(each one's oldest event first, every webhook's first before any webhook's second), so one group's
webhook with thousands of events due (a receiver down, every event retried) never keeps another
group's alerts waiting behind them. The outcome is written only by the
lease's holder. Signing is Stripe's scheme: ``Router-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>" with the webhook's secret>`` (:func:`sign`, :func:`verify`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from billing.schema import ddl
from billing.store import Database

SIGNATURE_HEADER = "Router-Signature"
EVENT_HEADER = "Router-Event-Id"
DELETED = "webhook deleted"
_HTTP_STATUS = re.compile(r"HTTP \d{3}")


def migrations(dialect: str) -> list[str]:
    return ddl(
        dialect,
        """CREATE TABLE webhooks (id {id}, url TEXT NOT NULL, secret TEXT NOT NULL, group_name TEXT,
            balance_below BIGINT, expiry_within DOUBLE PRECISION, budgets INTEGER NOT NULL DEFAULT 1,
            created_at DOUBLE PRECISION NOT NULL, deleted_at DOUBLE PRECISION)""",
        """CREATE TABLE alert_outbox (id {id}, event_id TEXT NOT NULL UNIQUE, webhook_id BIGINT NOT NULL,
            event_type TEXT NOT NULL, body TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
            next_at DOUBLE PRECISION NOT NULL, lease_owner TEXT, lease_until DOUBLE PRECISION,
            last_error TEXT, last_status INTEGER, delivered_at DOUBLE PRECISION)""",
        "CREATE INDEX alert_outbox_due ON alert_outbox(status, next_at)",
        "CREATE INDEX alert_outbox_webhook ON alert_outbox(webhook_id, id)",
        "CREATE TABLE alert_arming (rule TEXT PRIMARY KEY, episode INTEGER NOT NULL, low INTEGER NOT NULL)",
    )


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, body: bytes, at: int | None = None) -> str:
    """The ``Router-Signature`` header's value for ``body`` sent at ``at`` (unix seconds)."""
    at = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def verify(secret: str, header: str, body: bytes, tolerance: float = 300.0, now: float | None = None) -> bool:
    """Whether ``header`` signs ``body`` with ``secret``, made within ``tolerance`` seconds of ``now``
    (what a receiver does; constant-time comparison)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        at = int(parts["t"])
    except (KeyError, ValueError):
        return False
    now = time.time() if now is None else now
    if abs(now - at) > tolerance:
        return False
    expected = sign(secret, body, at).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass(frozen=True, slots=True)
class Webhook:
    id: int
    url: str
    secret: str
    group: str | None  # None: every group
    balance_below: int | None  # nano-credits
    expiry_within: float | None  # seconds
    budgets: bool  # the budget windows' 50/80/100 % alerts
    created_at: float

    def json(self) -> dict[str, Any]:
        """As the API and the audit log show it: without its secret."""
        return {
            "id": self.id,
            "url": self.url,
            "group": self.group,
            "balance_below_nano": self.balance_below,
            "expiry_within": self.expiry_within,
            "budgets": self.budgets,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class Delivery:
    id: int
    event_id: str
    webhook_id: int
    event_type: str
    body: str
    created_at: float
    status: str  # pending | delivered | failed
    attempts: int
    next_at: float
    last_error: str | None
    last_status: int | None
    delivered_at: float | None

    @property
    def error(self) -> str | None:
        """The last attempt's error as the API, the console and the CLI show it: ``HTTP <status>``,
        ``failed`` or ``webhook deleted``, never what failed in the network (which would map it for
        whoever can add a webhook); rows written before this rule kept an exception's text."""
        shown = self.last_error
        return shown if shown is None or shown == DELETED or _HTTP_STATUS.fullmatch(shown) else "failed"

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
            "webhook_id": self.webhook_id,
            "type": self.event_type,
            "created_at": self.created_at,
            "status": self.status,
            "attempts": self.attempts,
            "next_at": self.next_at,
            "last_error": self.error,
            "last_status": self.last_status,
            "delivered_at": self.delivered_at,
            "event": json.loads(self.body),
        }


_WEBHOOK = (
    "SELECT id, url, secret, group_name, balance_below, expiry_within, budgets, created_at FROM webhooks"
)
_DELIVERY = (
    "SELECT id, event_id, webhook_id, event_type, body, created_at, status, attempts, next_at, last_error, "
    "last_status, delivered_at FROM alert_outbox"
)


def _webhook(r: Any) -> Webhook:
    return Webhook(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7])


class AlertBook:
    """The webhooks, the outbox and the arming, on one database handle (migrated on first use)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False
        self._lock = asyncio.Lock()
        # whether any webhook exists, as last read (by webhooks(): the checks, every check_interval) or
        # changed here; None: not read yet. With none, the deliveries do not look at the outbox at all.
        self.any_webhooks: bool | None = None

    async def ready(self) -> None:
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self.db.migrate("alerts_schema_version", migrations(self.db.dialect))
                    self._ready = True

    # -- webhooks -----------------------------------------------------------------------------------
    async def add_webhook(
        self,
        url: str,
        group: str | None,
        balance_below: int | None,
        expiry_within: float | None,
        budgets: bool = True,
    ) -> Webhook:
        await self.ready()
        secret, now = new_secret(), time.time()
        await self.db.write(
            "INSERT INTO webhooks (url, secret, group_name, balance_below, expiry_within, budgets, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (url, secret, group, balance_below, expiry_within, int(budgets), now),
        )
        rows = await self.db.select(_WEBHOOK + " WHERE secret = ?", (secret,))
        self.any_webhooks = True
        return _webhook(rows[0])

    async def webhooks(self) -> list[Webhook]:
        await self.ready()
        hooks = [
            _webhook(r) for r in await self.db.select(_WEBHOOK + " WHERE deleted_at IS NULL ORDER BY id")
        ]
        self.any_webhooks = bool(hooks)
        return hooks

    async def webhook(self, webhook_id: int) -> Webhook | None:
        await self.ready()
        rows = await self.db.select(_WEBHOOK + " WHERE id = ? AND deleted_at IS NULL", (webhook_id,))
        return _webhook(rows[0]) if rows else None

    async def delete_webhook(self, webhook_id: int) -> bool:
        """Stop alerting this webhook; its pending events are not delivered (their rows stay, failed)."""
        await self.ready()
        changed = await self.db.atomic(
            [
                (
                    "UPDATE webhooks SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                    (time.time(), webhook_id),
                ),
                (
                    "UPDATE alert_outbox SET status = 'failed', last_error = 'webhook deleted' "
                    "WHERE webhook_id = ? AND status = 'pending'",
                    (webhook_id,),
                ),
            ]
        )
        return changed[0] > 0

    # -- events -------------------------------------------------------------------------------------
    async def fire(self, event_id: str, webhook_id: int, event_type: str, data: dict[str, Any]) -> bool:
        """Queue the event unless an event of this id was queued before (then False)."""
        await self.ready()
        now = time.time()
        body = json.dumps({"id": event_id, "type": event_type, "created": now, "data": data}, sort_keys=True)
        changed = await self.db.atomic(
            [
                (
                    "INSERT INTO alert_outbox (event_id, webhook_id, event_type, body, created_at, next_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                    (event_id, webhook_id, event_type, body, now, now),
                )
            ]
        )
        return changed[0] > 0

    async def episode(self, rule: str, low: bool) -> int:
        """The balance rule's current episode; ``low``: the balance is under the threshold now. Going back
        above it after an alert moves the episode on (the next dip alerts again)."""
        await self.ready()
        if low:
            await self.db.write(
                "INSERT INTO alert_arming (rule, episode, low) VALUES (?, 0, 1) "
                "ON CONFLICT (rule) DO UPDATE SET low = 1",
                (rule,),
            )
        else:
            await self.db.write(
                "UPDATE alert_arming SET low = 0, episode = episode + 1 WHERE rule = ? AND low = 1", (rule,)
            )
        rows = await self.db.select("SELECT episode FROM alert_arming WHERE rule = ?", (rule,))
        return int(rows[0][0]) if rows else 0

    async def expiring_keys(self, before: float) -> list[tuple[int, str, str, float]]:
        """Live keys expiring before ``before`` and not yet expired: (id, group, name, expires_at)."""
        await self.ready()
        rows = await self.db.select(
            "SELECT k.id, g.name, k.name, k.expires_at FROM keys k JOIN groups g ON g.id = k.group_id "
            "WHERE k.revoked_at IS NULL AND k.expires_at IS NOT NULL AND k.expires_at <= ? AND k.expires_at > ?",
            (before, time.time()),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    # -- deliveries ---------------------------------------------------------------------------------
    async def claim(self, owner: str, lease: float, limit: int, busy: Collection[int] = ()) -> list[Delivery]:
        """Due events whose lease is free or has run out, now held by ``owner`` for ``lease`` seconds:
        up to ``limit``, the webhooks in turn (each one's oldest first), none for a webhook in ``busy``."""
        await self.ready()
        now = time.time()
        skip = tuple(busy)
        free = "status = 'pending' AND next_at <= ? AND (lease_until IS NULL OR lease_until < ?)"
        due = free + (f" AND webhook_id NOT IN ({', '.join('?' * len(skip))})" if skip else "")
        if not await self.db.select(f"SELECT id FROM alert_outbox WHERE {due} LIMIT 1", (now, now, *skip)):
            return []  # nothing due: a read, not a write (no write lock taken on SQLite)
        await self.db.atomic(
            [
                (
                    f"UPDATE alert_outbox SET lease_owner = ?, lease_until = ? WHERE {free} AND id IN "
                    f"(SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY webhook_id ORDER BY id) AS turn "
                    f"FROM alert_outbox WHERE {due}) AS due ORDER BY turn, id LIMIT ?)",
                    (owner, now + lease, now, now, now, now, *skip, limit),
                )
            ]
        )
        rows = await self.db.select(
            _DELIVERY + " WHERE lease_owner = ? AND status = 'pending' ORDER BY id", (owner,)
        )
        return [Delivery(*r) for r in rows]

    async def delivered(self, delivery: Delivery, owner: str, status: int) -> None:
        await self.db.write(
            "UPDATE alert_outbox SET status = 'delivered', delivered_at = ?, attempts = attempts + 1, last_status = ?, "
            "last_error = NULL, lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
            (time.time(), status, delivery.id, owner),
        )

    async def failed(
        self, delivery: Delivery, owner: str, error: str, status: int | None, retry_at: float | None
    ) -> None:
        """A failed attempt: retried at ``retry_at``, or (None) given up."""
        await self.db.write(
            "UPDATE alert_outbox SET status = ?, attempts = attempts + 1, last_error = ?, last_status = ?, "
            "next_at = ?, lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
            (
                "pending" if retry_at is not None else "failed",
                error[:500],
                status,
                retry_at if retry_at is not None else delivery.next_at,
                delivery.id,
                owner,
            ),
        )

    async def deliveries(self, webhook_id: int | None = None, limit: int = 100) -> list[Delivery]:
        """Events, newest first (one webhook's if given)."""
        await self.ready()
        if webhook_id is None:
            rows = await self.db.select(_DELIVERY + " ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = await self.db.select(
                _DELIVERY + " WHERE webhook_id = ? ORDER BY id DESC LIMIT ?", (webhook_id, limit)
            )
        return [Delivery(*r) for r in rows]
