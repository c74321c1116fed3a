"""The settlement journal: settlements the store could not take, kept on local disk until it can.

One JSON line per settlement (its id, the reservation, the usage record), appended and fsync'd
before the settlement counts as done (billing/ledger.py, :class:`billing.durable.Durable`). The
store applies journaled settlements with :meth:`billing.store.Store.replay`, each at most once: the
settlement's id goes into the store's ``journal_applied`` table in the same transaction as its
charge, so a replay cut short (a crash between the store's commit and the journal's rewrite) is
harmless the next time. Replayed entries are then removed: the file is rewritten with what is left
(a temporary file, fsync'd, renamed over it).

Several processes may point at one path (replicas started with one config on one machine): each
takes an exclusive ``flock`` on the file it writes, and a process that finds the path taken uses
``PATH.1``, ``PATH.2``, ... At start a process also replays the siblings nobody holds (a dead
process's journal). Each entry carries its store's tag (a hash of the store URL): a process replays
only its own store's entries and leaves the others in place, so two gateways on one machine with
different databases never apply each other's settlements.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

from billing.records import Reservation, UsageRecord


@dataclass(frozen=True, slots=True)
class Entry:
    """One journaled settlement."""

    id: str  # unique: the store keeps it once applied
    reservation: Reservation
    record: UsageRecord
    store: str = ""  # which store it belongs to (:func:`store_tag`): a journal never crosses stores

    @staticmethod
    def new(reservation: Reservation, record: UsageRecord, id: str = "") -> Entry:
        return Entry(id or secrets.token_hex(16), reservation, record)

    def line(self) -> bytes:
        r = self.reservation
        body = {
            "id": self.id,
            "reservation": [r.id, r.group_id, r.key_id, r.amount],
            "record": asdict(self.record),
            "store": self.store,
        }
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"

    @staticmethod
    def parse(line: bytes) -> Entry:
        body = json.loads(line)
        return Entry(
            body["id"],
            Reservation(*body["reservation"]),
            UsageRecord(**body["record"]),
            body.get("store", ""),
        )


class Journal:
    """An append-only file of :class:`Entry` lines, held by this process (``flock``)."""

    def __init__(self, path: Path, store: str = "") -> None:
        self.base = path
        self.path = path
        self.store = store  # the tag of the store its entries belong to; others' are kept, never replayed
        self._file: IO[bytes] | None = None
        self.count = 0  # entries in the file

    def open(self) -> None:
        """Take the first of ``PATH``, ``PATH.1``, ... that no other process holds."""
        if self._file is not None:
            return
        self.base.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            path = self.base if n == 0 else self.base.with_name(f"{self.base.name}.{n}")
            held = _lock(path)
            if held is not None:
                self.path, self._file = path, held
                self.count = len(self.read())
                return
        raise OSError(f"every settlement journal at {self.base} is held by another process")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, entries: list[Entry]) -> None:
        """Write ``entries`` and fsync: on return they survive the process and the machine."""
        assert self._file is not None, "the journal is not open"
        self._file.seek(0, os.SEEK_END)
        self._file.write(b"".join(replace(e, store=self.store).line() for e in entries))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.count += len(entries)

    def read(self) -> list[Entry]:
        """This store's entries in this process's file (a line cut short by a crash is skipped)."""
        return [e for e in _entries(self.path) if e.store == self.store]

    def remove(self, ids: set[str]) -> None:
        """Rewrite the file without the entries ``ids`` (applied by the store)."""
        assert self._file is not None
        left = [e for e in _entries(self.path) if e.id not in ids]
        old, self._file = self._file, _rewrite(self.path, left)  # the new file, held before it is renamed
        old.close()
        self.count = sum(e.store == self.store for e in left)

    def orphans(self) -> list[Path]:
        """Sibling journals (``PATH``, ``PATH.N``) that no live process holds, with entries in them."""
        found = []
        candidates = [self.base, *self.base.parent.glob(self.base.name + ".*")]
        for path in candidates:
            if (
                path == self.path
                or not path.is_file()
                or not _sibling(self.base, path)
                or path.stat().st_size == 0
            ):
                continue
            found.append(path)
        return found


def adopt(path: Path, store: str) -> tuple[list[Entry], IO[bytes]] | None:
    """The entries of ``store`` in another process's journal, if none holds it now (the held file is
    returned: keep it until :func:`finish`)."""
    held = _lock(path)
    if held is None:
        return None
    return [e for e in _entries(path) if e.store == store], held


def finish(path: Path, held: IO[bytes], done: set[str]) -> None:
    """After replaying an adopted journal: remove the entries ``done`` (the file goes if it is empty)."""
    left = [e for e in _entries(path) if e.id not in done]
    if left:
        _rewrite(path, left).close()
    else:
        path.unlink(missing_ok=True)
    held.close()


def store_tag(url: str) -> str:
    """A store's tag for its journal entries: a hash of its URL (no secret in the file)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def _sibling(base: Path, path: Path) -> bool:
    return path == base or (
        path.name.startswith(base.name + ".") and path.name[len(base.name) + 1 :].isdigit()
    )


def _lock(path: Path) -> IO[bytes] | None:
    handle = open(path, "ab+")  # noqa: SIM115 - held while this process writes it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _entries(path: Path) -> list[Entry]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    entries = []
    for line in data.splitlines():
        try:
            entries.append(Entry.parse(line))
        except (ValueError, KeyError, TypeError):
            continue  # the last line of a crash, cut short: never fsync'd, so never counted as done
    return entries


def _rewrite(path: Path, entries: list[Entry]) -> IO[bytes]:
    """Replace ``path`` with a file of ``entries``, locked before it takes the name; returns it."""
    tmp = path.with_name(path.name + ".tmp")
    out = open(tmp, "wb+")  # noqa: SIM115 - returned, held
    fcntl.flock(out, fcntl.LOCK_EX)
    out.write(b"".join(e.line() for e in entries))
    out.flush()
    os.fsync(out.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return out
