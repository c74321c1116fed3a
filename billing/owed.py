"""The owed log: the settlements a SQLite gateway's replies went out before, kept until the group commit
that writes them (docs/operations.md, "Faults").

A reply's last byte must not go out before its charge would survive the process: waiting for its own
transaction costs a call ~115 us (a group commit of one), while a batch of ten costs ~23 us each. So
the store writes one line per settlement here first (``os.write``, no fsync: in the kernel's cache,
it survives the process; the same promise as the store's own WAL with ``synchronous=NORMAL``), the
reply goes out, and the settlement lingers for the next group commit as before.

    reply ──► line (seq N) ──► reply's last byte ──► ... group commit: settlements + "seqs a..b applied"
                                                                   │ (same transaction)
    nothing queued any more ──► the file is emptied ◄──────────────┘
    a start after a crash ──► the lines whose seq no applied range holds are settled (once: each as a
                              journal entry ``owed:EPOCH:N``, which billing/journal.py may hold too)

Each file begins with an epoch line (a random tag): the applied ranges in ``owed_applied`` are per
epoch, and a start begins a new one once the last epoch's lines are settled.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

from billing.store import Reservation, UsageRecord

_encode = msgspec.json.Encoder().encode


class Line(msgspec.Struct, array_like=True):
    seq: int
    reservation: tuple[int, int, int, int]  # id, group, key, amount
    record: UsageRecord


_decode = msgspec.json.Decoder(Line).decode


class OwedLog:
    """One process's owed log (the store's owner: one per database file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.epoch = ""
        self.seq = 0  # the last line's
        self._fd = -1

    def open(self) -> tuple[str, list[tuple[int, Reservation, UsageRecord]]]:
        """Open the file; what a previous process left in it: (its epoch, its lines). The file keeps
        them until :meth:`begin` starts a new epoch (once they are settled)."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with open(self.path, "rb") as f:
            data = f.read()
        if not data:
            return "", []
        head, _, rest = data.partition(b"\n")
        lines = []
        for raw in rest.splitlines():
            try:
                line = _decode(raw)
            except msgspec.DecodeError:
                continue  # cut short by the crash: its reply never went out
            lines.append((line.seq, Reservation(*line.reservation), line.record))
        return head.decode(errors="replace").strip(), lines

    def begin(self) -> None:
        """Empty the file and start a new epoch."""
        self.epoch = secrets.token_hex(8)
        self.seq = 0
        self.truncate()

    def write(self, reservation: Reservation, record: UsageRecord) -> int:
        """One settlement's line, handed to the kernel; its seq."""
        self.seq += 1
        r = reservation
        os.write(self._fd, _encode(Line(self.seq, (r.id, r.group_id, r.key_id, r.amount), record)) + b"\n")
        return self.seq

    def truncate(self) -> None:
        """Every line written so far is applied: empty the file (the epoch line stays)."""
        os.ftruncate(self._fd, 0)
        os.write(self._fd, self.epoch.encode() + b"\n")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def entry_id(epoch: str, seq: int) -> str:
    """The id a line's settlement has as a journal entry (billing/journal.py): applied at most once."""
    return f"owed:{epoch}:{seq}"
