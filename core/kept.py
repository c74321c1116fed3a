"""Values kept by the bytes they were made from, within a budget of those bytes.

A coding agent sends the same large parts every turn (Codex: 30 tools, 8 KB); what is made of them
(decoded, translated) is kept by their bytes, and made again only for bytes not seen before. The
bytes are the key, so a caller gets what its own bytes make, whoever sent them first; the values are
shared: read them, never change them.

A kept list is a :class:`Shared` one, and what a later stage makes of it (the tools as structs, as an
adapter's blocks, as JSON) is kept on it by :func:`once`: made once per set, not once per call, and let
go with it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar, cast

import msgspec

V = TypeVar("V")
T = TypeVar("T")


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


class Shared(list[T]):
    """A list kept (:class:`Kept`) and shared by the calls that send its bytes: never changed. ``made``:
    what stages made of it, by :func:`once`."""

    __slots__ = ("made",)

    def __init__(self, items: Iterable[T] = ()) -> None:
        super().__init__(items)
        self.made: dict[Hashable, Any] = {}


def once(items: list[Any], key: Hashable, make: Callable[[list[Any]], V]) -> V:
    """``make(items)``: kept on ``items`` under ``key`` when they are :class:`Shared` (then shared too:
    read it, never change it), else made anew. A list made of a shared set is :class:`Shared` itself,
    so what the next stage makes of it is kept the same way. A ``make`` that raises keeps nothing."""
    if type(items) is not Shared:
        return make(items)
    made: Any = items.made.get(key)
    if made is None:
        made = make(items)
        if type(made) is list:
            made = Shared(made)
        items.made[key] = made
    return cast(V, made)


def as_sent(items: Any) -> Any:
    """``items`` as a request body carries them: a :class:`Shared` list as its JSON, encoded once for the
    set (:class:`msgspec.Raw`, which the body's encoder copies as it is), anything else as it is."""
    return once(items, "json", _raw) if type(items) is Shared else items


_encode = msgspec.json.Encoder().encode


def _raw(items: list[Any]) -> msgspec.Raw:
    return msgspec.Raw(_encode(items))
