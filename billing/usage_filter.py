"""Which usage records a question is about: :class:`Filter`, and its SQL on the index that serves it.

Every index of the ``usage`` table that a filter can use ends in ``id`` (billing's migrations), so a
filter is an index range read in id order, and a period an id range inside it (billing/history.py):
``(group_id, id)``, ``(group_id, source, id)``, ``(group_id, model, id)``, ``(group_id, status,
id)``, ``(group_id, deployment, id)``, ``(group_id, end_user, id)``, ``(key_id, id)``, ``(batch_id,
id)`` and ``request_id``. :func:`where` picks the most selective one the filter allows (SQLite is told
which with ``INDEXED BY``; PostgreSQL's planner picks) and tests the rest of the filter on each row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# the filter's fields that are columns of the usage table, tested as ``column = ?``
_EQUAL = (
    "group_id",
    "key_id",
    "request_id",
    "batch_id",
    "model",
    "deployment",
    "end_user",
    "provider",
    "endpoint",
    "upstream_request_id",
)
# fields of a few known values, written into the SQL as literals: how rare a value is decides the best
# plan (1 % of calls are rejected, 96 % ok), and PostgreSQL plans a statement it has prepared five
# times once for any value (a generic plan) unless the value is part of the statement
_LITERALS = {
    "status": frozenset({"ok", "error", "interrupted", "rejected"}),
    "source": frozenset({"api", "job"}),
}
# (field, index) in the order they are preferred; an index on (group_id, field, id) needs the group
_INDEXES = (
    ("request_id", "usage_request", False),
    ("key_id", "usage_key", False),
    ("batch_id", "usage_batch", False),
    ("model", "usage_group_model", True),
    ("deployment", "usage_group_deployment", True),
    ("end_user", "usage_group_user", True),
    ("status", "usage_group_status", True),
    ("source", "usage_group_source", True),
)
# the fields the hourly rollup keeps (billing/rollup.py): a filter on these alone can be answered from it
ROLLED = frozenset(
    {
        "group_id",
        "key_id",
        "model",
        "models",
        "provider",
        "deployment",
        "endpoint",
        "source",
        "since",
        "until",
    }
)


@dataclass(frozen=True, slots=True)
class Filter:
    group_id: int | None = None  # None: every group
    source: str | None = None  # "api" | "job" | None (all)
    model: str | None = None
    key_id: int | None = None
    since: float | None = None
    until: float | None = None  # exclusive
    deployment: str | None = None  # the provider's deployment that served
    models: tuple[str, ...] | None = None  # any of these model ids (a prefix or alias resolved to several)
    status: str | None = None  # ok | error | interrupted | rejected
    provider: str | None = None
    endpoint: str | None = None
    stream: bool | None = None
    request_id: str | None = None
    upstream_request_id: str | None = None  # the provider's (no index: a search of it keeps to a period)
    end_user: str | None = None
    batch_id: str | None = None

    def given(self) -> set[str]:
        """The names of the fields set."""
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def rolled(self) -> bool:
        """Whether the hourly rollup can answer aggregates of this filter."""
        return self.given() <= ROLLED


def where(f: Filter, lo: int | None, hi: int | None, sqlite: bool) -> tuple[str, list[Any]]:
    """The FROM and WHERE of ``f`` restricted to ids in ``[lo, hi)``, on the index that serves it
    best (``lo`` / ``hi`` None: unbounded)."""
    index = None
    for name, candidate, needs_group in _INDEXES:
        if getattr(f, name) is not None and (f.group_id is not None or not needs_group):
            index = candidate
            break
    if index is None and f.group_id is not None:
        index = "usage_group_ts"
    clauses: list[str] = []
    args: list[Any] = []
    for name in _EQUAL:
        value = getattr(f, name)
        if value is not None:
            clauses.append(f"{name} = ?")
            args.append(value)
    for name, known in _LITERALS.items():
        value = getattr(f, name)
        if value in known:
            clauses.append(f"{name} = '{value}'")
        elif value is not None:
            clauses.append(f"{name} = ?")
            args.append(value)
    if f.stream is not None:
        clauses.append("stream" if f.stream else "NOT stream")
    if f.models is not None:
        clauses.append(f"model IN ({', '.join('?' * len(f.models))})" if f.models else "1 = 0")
        args.extend(f.models)
    for clause, value in (("ts >= ?", f.since), ("ts < ?", f.until), ("id >= ?", lo), ("id < ?", hi)):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    if sqlite:
        source = f"usage INDEXED BY {index}" if index else "usage NOT INDEXED"
    else:
        source = "usage"
    return f"FROM {source} WHERE " + (" AND ".join(clauses) or "1 = 1"), args
