"""The console's own data: its settings (the admin password's hash, the session secret) in a table of
its own, ``console_settings``, and the logged-in sessions in ``console_sessions`` (the SHA-256 of each
session id, the credential it logged in with, its expiry: shared by every replica, so a logout or a new
password ends a session everywhere at once), on the store's database handle. Everything else the console shows it
reads through the store: groups and keys, and the usage history (``store.history``,
:mod:`billing.history`).
"""

from __future__ import annotations

import asyncio
import time

from billing.store import Database, Store
from console import operators

MIGRATIONS = [
    # 1: the settings (IF NOT EXISTS: earlier versions created the table without a version)
    "CREATE TABLE IF NOT EXISTS console_settings "
    "(name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
    # 2: logged-in sessions, by the SHA-256 of their id
    "CREATE TABLE console_sessions "
    "(id TEXT PRIMARY KEY, credential TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL)",
    # 3: one-time messages across a redirect (console/flash.py)
    "CREATE TABLE console_flash (token TEXT PRIMARY KEY, sealed TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL)",
    # 4: named operators (console/operators.py)
    operators.MIGRATION,
    # 5: whose session it is (NULL: the built-in admin's)
    "ALTER TABLE console_sessions ADD COLUMN operator TEXT",
]


class Queries:
    """Dialect-neutral SQL on the store's database handle."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                await self.db.migrate("console_schema_version", MIGRATIONS)
                self._ready = True

    async def get_setting(self, name: str) -> str | None:
        await self.ready()
        rows = await self.db.select("SELECT value FROM console_settings WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    async def set_setting(self, name: str, value: str) -> None:
        await self.ready()
        await self.db.write(
            "INSERT INTO console_settings (name, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (name, value, time.time()),
        )

    async def setting_or_default(self, name: str, default: str) -> str:
        """The stored value, storing ``default`` first if there is none (first writer wins)."""
        await self.ready()
        await self.db.write(
            "INSERT INTO console_settings (name, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, default, time.time()),
        )
        value = await self.get_setting(name)
        assert value is not None
        return value

    # -- sessions (ids are stored hashed: a leaked table opens nothing) ------------------------------
    async def session_start(
        self, sid_hash: str, credential: str, expires: float, operator: str | None = None
    ) -> None:
        await self.ready()
        await self.db.write("DELETE FROM console_sessions WHERE expires < ?", (time.time(),))
        await self.db.write(
            "INSERT INTO console_sessions (id, credential, expires, operator) VALUES (?, ?, ?, ?)",
            (sid_hash, credential, expires, operator),
        )

    async def session_credential(self, sid_hash: str) -> tuple[str, str | None] | None:
        """The credential fingerprint a live session logged in with and its operator (None: the
        built-in admin), or None (ended, expired, unknown)."""
        await self.ready()
        rows = await self.db.select(
            "SELECT credential, operator FROM console_sessions WHERE id = ? AND expires >= ?",
            (sid_hash, time.time()),
        )
        return (str(rows[0][0]), None if rows[0][1] is None else str(rows[0][1])) if rows else None

    async def session_end(self, sid_hash: str) -> None:
        await self.ready()
        await self.db.write("DELETE FROM console_sessions WHERE id = ?", (sid_hash,))

    async def sessions_end_all(self) -> None:
        await self.ready()
        await self.db.write("DELETE FROM console_sessions")

    @property
    def operators(self) -> operators.Operators:
        return operators.Operators(self.db)


def queries_for(store: Store) -> Queries:
    return Queries(store.database)
