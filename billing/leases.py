"""Holds as leases (PostgreSQL, several replicas; docs/operations.md, "Faults").

Each replica names itself (host, pid, a random tag) on the reservations it makes and heartbeats a
row of ``replicas`` every ``heartbeat_seconds``. Any replica that has itself heartbeaten without a
miss for ``lease_grace_seconds`` releases the holds of a replica whose heartbeat is older than that
grace, each with an ``interrupted`` usage record carrying the hold's model, key and request id,
charged what its stream had generated at its last checkpoint (billing/progress.py; nothing for a
call that had none), then deletes its row. The "itself" rule
keeps an outage of the database from looking like the death of everyone: when it comes back, no
replica judges another before both have had a whole grace to heartbeat.

A replica's graceful stop settles its holds, then deletes its row. The start-time reconcile
(``stale_reservation_seconds``) still releases any hold older than that, whoever made it (rows from
before leases have no replica).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time

from billing.postgres_ledger import NOW, release
from billing.postgres_pool import PostgresPool
from core import metrics

log = logging.getLogger("router.store")
CHUNK = 500
HEARTBEAT = (
    f"INSERT INTO replicas (id, started_at, heartbeat, pid, host) VALUES ($1, {NOW}, {NOW}, $2, $3) "
    f"ON CONFLICT (id) DO UPDATE SET heartbeat = {NOW}"
)
DEAD = f"SELECT id FROM replicas WHERE id <> $1 AND heartbeat < {NOW} - $2::float8 ORDER BY id"
HOLDS_OF = "SELECT id FROM reservations WHERE replica = $1 ORDER BY id LIMIT $2"
FORGET = "DELETE FROM replicas WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM reservations WHERE replica = $1)"


def released_by_lease(replica: str) -> str:
    return f"held by replica {replica}, which stopped heartbeating; released by another replica"


class Leases:
    """This replica's heartbeat and the release of dead replicas' holds (see the module docstring)."""

    def __init__(self, db: PostgresPool, *, grace: float, every: float) -> None:
        self.db = db
        self.grace = grace
        self.every = every
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.released = 0  # holds of dead replicas released by this one
        self._task: asyncio.Task[None] | None = None
        self._up_since: float | None = None  # since when every heartbeat succeeded

    async def start(self) -> None:
        await self.beat()  # the row exists before any reservation names this replica
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def leave(self) -> None:
        """Delete this replica's row (a graceful stop, once its holds are settled)."""
        try:
            await self.db.execute(FORGET, self.replica)
        except Exception as exc:  # the store is down: the others will forget the row after the grace
            log.warning("could not remove this replica's heartbeat row: %r", exc)

    async def beat(self) -> None:
        await self.db.execute(HEARTBEAT, self.replica, os.getpid(), socket.gethostname())
        now = time.monotonic()
        if self._up_since is None:
            self._up_since = now

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.beat()
                assert self._up_since is not None
                if time.monotonic() - self._up_since >= self.grace:
                    await self.reap()
            except Exception as exc:
                self._up_since = None
                metrics.store_error("heartbeat")
                log.warning("heartbeat failed: %r", exc)

    async def reap(self) -> int:
        """Release every hold of the replicas whose heartbeat is older than the grace."""
        total = 0
        for (replica,) in await self.db.fetch(DEAD, self.replica, self.grace):
            async with self.db.connection() as conn:
                while True:
                    ids = [r[0] for r in await conn.fetch(HOLDS_OF, replica, CHUNK)]
                    taken = await release(conn, ids, released_by_lease(replica)) if ids else 0
                    total += taken
                    if taken < CHUNK:
                        break
                await conn.execute(FORGET, replica)
            log.warning("replica %s stopped heartbeating: released its holds", replica)
        if total:
            self.released += total
            metrics.holds_released("dead_replica", total)
        return total
