"""The ledger's records: a call's :class:`UsageRecord` and the ``usage`` table's columns (read and
written from here by every store), a :class:`Reservation`, a key's :class:`ModelUsage`. Shared by the
store interface (:mod:`billing.store`, which names them too), the usage history (:mod:`billing.history`)
and the settlement journal (:mod:`billing.journal`), which import them from here and not the store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any


@dataclass(slots=True)
class UsageRecord:
    """One call, as docs/operations.md lists it ("Usage records"). ``credits`` is what was charged, in
    nano-credits. ``status``: ``ok``, ``error`` (it failed after its reservation: upstream, timeout),
    ``interrupted`` (the caller went away, or the gateway stopped) or ``rejected`` (refused before
    anything was reserved: a bad request, a model it may not use, a rate limit, too few credits; never
    charged). ``error_code`` is the OpenAI-shaped error's code; ``batch_id`` the batch of a job's line;
    ``end_user`` the request's ``user``."""

    key_id: int
    group_id: int
    model: str
    provider: str
    deployment: str = ""  # the provider's deployment that served (core/deployments.py); "" before one did
    endpoint: str = "chat"
    source: str = "api"  # api | job
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    credits: int = 0
    status: str = "ok"  # ok | error | interrupted | rejected
    usage_exact: bool = True
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    upstream_request_id: str | None = None
    request_id: str | None = None
    error: str | None = None
    error_code: str | None = None
    batch_id: str | None = None
    end_user: str | None = None
    safety_identifier: str | None = None  # OpenAI's, as the request sent it
    metadata: str | None = None  # the request's ``metadata`` (a map of strings), as compact JSON
    # when more than one was tried: each attempt as compact JSON, ``[[deployment, outcome, ms], ...]``
    # (outcome: ``ok``, or the error's code), in order (gateway/reliability.py)
    attempts: str | None = None
    ts: float = 0.0
    id: int = 0


# The columns of the ``usage`` table are the fields of UsageRecord (``id`` aside), in this order; every
# store writes and reads them from here.
USAGE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(UsageRecord) if f.name != "id")
USAGE_TYPES: dict[str, str] = {f.name: str(f.type) for f in fields(UsageRecord) if f.name != "id"}
USAGE_LIST = ", ".join(USAGE_COLUMNS)
USAGE_SELECT = "id, " + USAGE_LIST  # a row of it is read by usage_record
_CREDITS = USAGE_COLUMNS.index("credits")
_TS = USAGE_COLUMNS.index("ts")
_BOOLS = tuple(n for n, kind in USAGE_TYPES.items() if kind == "bool")
_values = attrgetter(*USAGE_COLUMNS)


def usage_values(record: UsageRecord, credits: int, now: float) -> tuple[Any, ...]:
    """The values of a record's usage row, in USAGE_COLUMNS order, charging ``credits`` (stamped
    ``now`` if the record has no time yet)."""
    values = list(_values(record))
    values[_CREDITS] = credits
    if not values[_TS]:
        values[_TS] = now
    return tuple(values)


def usage_record(row: Sequence[Any]) -> UsageRecord:
    """A row of ``SELECT {USAGE_SELECT} FROM usage``, from any of the stores."""
    record = UsageRecord(**dict(zip(USAGE_COLUMNS, row[1:], strict=True)), id=row[0])
    for name in _BOOLS:  # SQLite keeps them as 0 / 1
        setattr(record, name, bool(getattr(record, name)))
    return record


@dataclass(frozen=True, slots=True)
class Reservation:
    id: int
    group_id: int
    key_id: int
    amount: int


@dataclass(frozen=True, slots=True)
class ModelUsage:
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    credits: int
