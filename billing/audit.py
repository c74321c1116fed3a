"""The audit log: every change an operator makes (through the console, the admin API or the CLI) as a
row of ``audit_log``: when, who (``console``, ``admin-api``, ``cli:<OS user>``, with the client's
address where there is one), what (``key.rotate``, ``group.topup``, ...), on which object
(``key:12``, ``group:acme``), and the object before and after as JSON.

A snapshot never holds a secret: :func:`scrub` drops every field whose name says it is one (a key's
clear text or hash, a webhook's signing secret, a password or its hash, a token) at any depth, and
the snapshots of keys are built from :class:`billing.store.KeyInfo`, which has only the key's hint.
The table is on the store's database handle, migrated on first use (its own version table).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from billing.schema import ddl
from billing.store import Database

SECRET_FIELDS = frozenset({"key", "key_hash", "prev_hash", "secret", "password", "password_hash", "token"})


def migrations(dialect: str) -> list[str]:
    return ddl(
        dialect,
        "CREATE TABLE audit_log (id {id}, ts DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL, "
        "action TEXT NOT NULL, target TEXT NOT NULL, before TEXT, after TEXT)",
        "CREATE INDEX audit_log_target ON audit_log(target, id)",
    )


def scrub(value: Any) -> Any:
    """``value`` without any field named like a secret (at any depth)."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in SECRET_FIELDS}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    ts: float
    actor: str
    action: str
    target: str
    before: Any
    after: Any

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "before": self.before,
            "after": self.after,
        }


class Audit:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self.db.migrate("audit_schema_version", migrations(self.db.dialect))
                    self._ready = True

    async def record(self, actor: str, action: str, target: str, before: Any, after: Any) -> None:
        await self.ready()
        await self.db.write(
            "INSERT INTO audit_log (ts, actor, action, target, before, after) VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), actor, action, target, _encode(before), _encode(after)),
        )

    async def entries(
        self,
        limit: int = 100,
        before: int | None = None,
        target: str | None = None,
        action: str | None = None,
    ) -> list[AuditEntry]:
        """Entries, newest first: older than id ``before``, of one target or action if given."""
        await self.ready()
        where, args = [], []
        for clause, value in (("id < ?", before), ("target = ?", target), ("action = ?", action)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = "SELECT id, ts, actor, action, target, before, after FROM audit_log"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        rows = await self.db.select(sql, (*args, limit))
        return [AuditEntry(r[0], r[1], r[2], r[3], r[4], _decode(r[5]), _decode(r[6])) for r in rows]


def _encode(value: Any) -> str | None:
    return None if value is None else json.dumps(scrub(value), sort_keys=True, default=str)


def _decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)
