"""Values kept by the bytes they were made from, within a budget of those bytes.

A coding agent sends the same large parts every turn (Codex: 30 tools, 8 KB); what is made of them
(decoded, translated) is kept by their bytes, and made again only for bytes not seen before. The
bytes are the key, so a caller gets what its own bytes make, whoever sent them first; the values are
shared: read them, never change them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    """At most ``limit`` bytes of keys, the oldest let go first; a value whose bytes are over an eighth
    of the limit is not kept (one large set would push out many)."""

    __slots__ = ("limit", "values", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.values: dict[Hashable, tuple[V, int]] = {}
        self.size = 0

    def get(self, key: Hashable) -> V | None:
        kept = self.values.get(key)
        return kept[0] if kept is not None else None

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Keep ``value`` under ``key``, made from ``size`` bytes."""
        if size > self.limit // 8 or key in self.values:
            return
        while self.values and self.size + size > self.limit:
            oldest = next(iter(self.values))
            self.size -= self.values.pop(oldest)[1]
        self.values[key] = (value, size)
        self.size += size
