"""SQLite store: the embedded default. One connection, owned by one worker thread, in WAL mode.

Every operation runs on that thread (never on the event loop); the schema is versioned and migrated
on open. Several processes may share the file (the CLI beside a running gateway): WAL and a busy
timeout make that safe.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from billing.store import Group, KeyInfo, Principal, Store, StoreError

T = TypeVar("T")

MIGRATIONS: list[str] = [
    # 1: groups and keys
    """
    CREATE TABLE groups (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        balance INTEGER NOT NULL DEFAULT 0 CHECK (balance >= 0),
        reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
        spent INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE TABLE keys (
        id INTEGER PRIMARY KEY,
        group_id INTEGER NOT NULL REFERENCES groups(id),
        name TEXT NOT NULL DEFAULT '',
        key_hash TEXT NOT NULL UNIQUE,
        hint TEXT NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL,
        spend_cap INTEGER,
        spent INTEGER NOT NULL DEFAULT 0,
        allowed_models TEXT
    );
    CREATE INDEX keys_group ON keys(group_id);
    """,
]


def sqlite_path(url: str) -> str:
    rest = url[len("sqlite://") :]
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise StoreError(f"store URL {url!r} names no file")
    return rest


class SQLiteStore(Store):
    def __init__(self, url: str) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None

    # -- plumbing -------------------------------------------------------------------------------
    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._executor is not None, "store is not open"
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._db is not None
        return fn(self._db)

    def _connect(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=10000")
        self._db = db
        self._migrate(db)

    def _migrate(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else 0
            if row is None:
                db.execute("INSERT INTO schema_version VALUES (0)")
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("UPDATE schema_version SET version = ?", (number,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
            await self.run_setup()

    async def run_setup(self) -> None:
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)

    async def close(self) -> None:
        if self._executor is not None:
            def _close(db: sqlite3.Connection) -> None:
                db.close()

            if self._db is not None:
                await self.run(_close)
            self._db = None
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- groups ---------------------------------------------------------------------------------
    @staticmethod
    def _group(row: Any) -> Group:
        return Group(id=row[0], name=row[1], balance=row[2], reserved=row[3], spent=row[4], created_at=row[5])

    _GROUP_COLS = "id, name, balance, reserved, spent, created_at"

    async def create_group(self, name: str, credits: int) -> Group:
        if credits < 0:
            raise StoreError("a group's credits cannot be negative")

        def fn(db: sqlite3.Connection) -> Group:
            try:
                db.execute(
                    "INSERT INTO groups (name, balance, created_at) VALUES (?, ?, ?)", (name, credits, time.time())
                )
            except sqlite3.IntegrityError:
                raise StoreError(f"a group named {name!r} already exists") from None
            row = db.execute(f"SELECT {self._GROUP_COLS} FROM groups WHERE name = ?", (name,)).fetchone()
            return self._group(row)

        return await self.run(fn)

    async def get_group(self, name: str) -> Group | None:
        def fn(db: sqlite3.Connection) -> Group | None:
            row = db.execute(f"SELECT {self._GROUP_COLS} FROM groups WHERE name = ?", (name,)).fetchone()
            return self._group(row) if row else None

        return await self.run(fn)

    async def list_groups(self) -> list[Group]:
        def fn(db: sqlite3.Connection) -> list[Group]:
            rows = db.execute(f"SELECT {self._GROUP_COLS} FROM groups ORDER BY name").fetchall()
            return [self._group(r) for r in rows]

        return await self.run(fn)

    async def topup(self, name: str, amount: int) -> Group:
        if amount <= 0:
            raise StoreError("a top-up must be a positive amount")

        def fn(db: sqlite3.Connection) -> Group:
            cur = db.execute("UPDATE groups SET balance = balance + ? WHERE name = ?", (amount, name))
            if cur.rowcount == 0:
                raise StoreError(f"no group named {name!r}")
            row = db.execute(f"SELECT {self._GROUP_COLS} FROM groups WHERE name = ?", (name,)).fetchone()
            return self._group(row)

        return await self.run(fn)

    # -- keys -----------------------------------------------------------------------------------
    _KEY_SQL = (
        "SELECT k.id, k.group_id, g.name, k.name, k.hint, k.created_at, k.revoked_at, k.spend_cap, k.spent, "
        "k.allowed_models FROM keys k JOIN groups g ON g.id = k.group_id"
    )

    @staticmethod
    def _key(row: Any) -> KeyInfo:
        allowed = tuple(json.loads(row[9])) if row[9] else None
        return KeyInfo(
            id=row[0], group_id=row[1], group_name=row[2], name=row[3], hint=row[4], created_at=row[5],
            revoked_at=row[6], spend_cap=row[7], spent=row[8], allowed_models=allowed,
        )  # fmt: skip

    async def create_key(
        self,
        group: str,
        name: str,
        key_hash: str,
        hint: str,
        spend_cap: int | None = None,
        allowed_models: list[str] | None = None,
    ) -> KeyInfo:
        def fn(db: sqlite3.Connection) -> KeyInfo:
            row = db.execute("SELECT id FROM groups WHERE name = ?", (group,)).fetchone()
            if row is None:
                raise StoreError(f"no group named {group!r}")
            cur = db.execute(
                "INSERT INTO keys (group_id, name, key_hash, hint, created_at, spend_cap, allowed_models) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row[0], name, key_hash, hint, time.time(), spend_cap,
                 json.dumps(allowed_models) if allowed_models else None),
            )  # fmt: skip
            return self._key(db.execute(self._KEY_SQL + " WHERE k.id = ?", (cur.lastrowid,)).fetchone())

        return await self.run(fn)

    async def revoke_key(self, key_id: int) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (time.time(), key_id)
            )
            return cur.rowcount > 0

        return await self.run(fn)

    async def list_keys(self, group: str | None = None) -> list[KeyInfo]:
        def fn(db: sqlite3.Connection) -> list[KeyInfo]:
            if group is None:
                rows = db.execute(self._KEY_SQL + " ORDER BY k.id").fetchall()
            else:
                rows = db.execute(self._KEY_SQL + " WHERE g.name = ? ORDER BY k.id", (group,)).fetchall()
            return [self._key(r) for r in rows]

        return await self.run(fn)

    async def principal(self, key_hash: str) -> Principal | None:
        def fn(db: sqlite3.Connection) -> Principal | None:
            row = db.execute(
                "SELECT k.id, k.name, g.id, g.name, k.spend_cap, k.allowed_models FROM keys k "
                "JOIN groups g ON g.id = k.group_id WHERE k.key_hash = ? AND k.revoked_at IS NULL",
                (key_hash,),
            ).fetchone()
            if row is None:
                return None
            allowed = frozenset(json.loads(row[5])) if row[5] else None
            return Principal(row[0], row[1], row[2], row[3], row[4], allowed)

        return await self.run(fn)
