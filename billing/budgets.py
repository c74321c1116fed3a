"""Budgets with periods: spend limits over time for a group or a key, beside the prepaid balance
(docs/operations.md, "Budgets").

A budget is an amount per window. A window is a calendar period in a time zone (``day``, ``week``
from Monday, ``month``) or a rolling duration (``30m``, ``12h``, ``7d``: the last that long, up to
now). Any number of budgets may apply to one call (a key's and its group's, a day's and a month's).

The spend of a budget is kept per *bucket* (table ``budget_spend``): a calendar window is one bucket;
a rolling window of duration D is cut into 24 buckets of D/24 and counts every bucket that overlaps
the last D (the oldest one whole: it may over-count a little, never under-count). A settlement adds
its charge to the current bucket of each budget of its key and group, in the same transaction as the
charge itself (billing/sqlite.py ``settle_rows``, billing/postgres_ledger.py ``run_batch``).

Admission is the reservation's: a call is admitted when, for each budget, the window's spend plus
every worst case still held by the budget's key (or group) plus this call's worst case fits the
amount. Counting every hold in every window (a call reserved before a boundary and settled after it)
keeps the invariant ``spent in the window + held <= amount`` true at every moment of every window, so
no window's spend ever exceeds its amount, whatever runs concurrently: on PostgreSQL the check runs
with the key and group rows locked (replicas queue on them), on SQLite in the gateway's memory
(billing/ledger.py ``LocalLedger``), which alone spends from the file.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.money import to_credits

CALENDAR = ("day", "week", "month")
ROLLING_BUCKETS = 24
_ROLLING = re.compile(r"^(\d{1,6})([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_ROLLING, MAX_ROLLING = 60, 366 * 86400
HOUR = 3600

Clock = Callable[[], float]

TABLES = """
    CREATE TABLE budgets (
        id {id},
        group_id {int} NOT NULL REFERENCES groups(id),
        key_id {int} REFERENCES keys(id),
        amount {int} NOT NULL CHECK (amount > 0),
        period TEXT NOT NULL,
        tz TEXT NOT NULL,
        span {int} NOT NULL,
        created_at {real} NOT NULL
    );
    CREATE INDEX budgets_group ON budgets (group_id);
    CREATE TABLE budget_spend (
        budget_id {int} NOT NULL,
        bucket {int} NOT NULL,
        spent {int} NOT NULL,
        PRIMARY KEY (budget_id, bucket)
    );
"""  # the migration of the budgets' own version table (billing/schema.py ``ddl``)
VERSION_TABLE = "budget_schema_version"


class BudgetError(ValueError):
    """A budget that cannot be: an unparseable window, a time zone that does not exist, an amount
    that is not positive (the admin API answers 400, the CLI a one-line error)."""


@dataclass(frozen=True, slots=True)
class Period:
    """A window: ``name`` as written (``day``, ``12h``), in ``tz`` for a calendar one."""

    name: str
    tz: str
    seconds: int  # rolling: the duration; calendar: 0

    @property
    def calendar(self) -> bool:
        return self.seconds == 0

    @property
    def span(self) -> int:
        """At least the longest a window lasts (calendar: a DST hour included), in seconds."""
        if self.calendar:
            return {"day": 86400, "week": 7 * 86400, "month": 31 * 86400}[self.name] + HOUR
        return self.seconds + self.seconds // ROLLING_BUCKETS

    @property
    def size(self) -> int:
        """A rolling window's bucket, in seconds."""
        return max(self.seconds // ROLLING_BUCKETS, 1)

    def describe(self) -> str:
        if self.calendar:
            return f"per calendar {self.name} ({self.tz})"
        return f"per rolling {self.name}"

    def bucket(self, now: float) -> int:
        """The start (epoch seconds) of the bucket ``now`` falls in."""
        if not self.calendar:
            return int(now // self.size) * self.size
        return int(self._start(now).timestamp())

    def first(self, now: float) -> int:
        """The oldest bucket the window at ``now`` counts."""
        if self.calendar:
            return self.bucket(now)
        return int((now - self.seconds) // self.size) * self.size

    def resets_at(self, now: float, buckets: Iterable[tuple[int, int]]) -> float:
        """When the window's spend next goes down: a calendar window's end; for a rolling one, when
        the oldest bucket with spend leaves it."""
        if self.calendar:
            return self._next(self._start(now)).timestamp()
        spent = [b for b, amount in buckets if amount > 0 and b >= self.first(now)]
        oldest = min(spent) if spent else self.bucket(now)
        return float(oldest + self.size + self.seconds)

    def _start(self, now: float) -> datetime:
        local = datetime.fromtimestamp(now, ZoneInfo(self.tz))
        day = local.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.name == "week":
            day -= timedelta(days=day.weekday())
        elif self.name == "month":
            day = day.replace(day=1)
        return _normal(day)

    def _next(self, start: datetime) -> datetime:
        if self.name == "day":
            following = start.replace(tzinfo=None) + timedelta(days=1)
        elif self.name == "week":
            following = start.replace(tzinfo=None) + timedelta(days=7)
        else:
            month = start.month % 12 + 1
            following = start.replace(tzinfo=None, year=start.year + (start.month == 12), month=month)
        return _normal(following.replace(tzinfo=start.tzinfo))


def _normal(local: datetime) -> datetime:
    """A wall-clock time in its zone, as it really is (midnight skipped by DST: the next hour)."""
    return datetime.fromtimestamp(local.timestamp(), local.tzinfo)


def parse_period(text: Any, tz: str = "UTC") -> Period:
    """``day`` / ``week`` / ``month`` (calendar, in ``tz``) or ``<n>s|m|h|d`` (rolling)."""
    if not isinstance(text, str):
        raise BudgetError("a budget's window must be a string such as 'day', 'month' or '12h'")
    name = text.strip().lower()
    if name in CALENDAR:
        check_zone(tz)
        return Period(name, tz, 0)
    match = _ROLLING.match(name)
    if match is None:
        raise BudgetError(
            f"cannot parse the budget window {text!r}: use day, week, month (calendar) or a "
            "rolling duration such as 30m, 12h, 7d"
        )
    seconds = int(match[1]) * _UNIT[match[2]]
    if not MIN_ROLLING <= seconds <= MAX_ROLLING:
        raise BudgetError(f"the rolling budget window {text!r} must be between 1m and 366d")
    return Period(name, "UTC", seconds)


def check_zone(tz: Any) -> str:
    try:
        ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError):
        raise BudgetError(f"unknown time zone {tz!r}: use an IANA name such as UTC or Europe/Paris") from None
    return str(tz)


@dataclass(frozen=True, slots=True)
class Budget:
    id: int
    group_id: int
    key_id: int | None  # None: the group's (every key of it)
    amount: int  # nano-credits per window
    period: Period
    group_name: str = ""

    def describe(self, group_name: str = "") -> str:
        group = group_name or self.group_name or str(self.group_id)
        owner = f"key {self.key_id}" if self.key_id is not None else f"group {group}"
        return f"{to_credits(self.amount)} credits {self.period.describe()} for {owner}"


def budget_row(row: Sequence[Any]) -> Budget:
    """A row of ``SELECT id, group_id, key_id, amount, period, tz[, the group's name] FROM budgets``."""
    period = parse_period(row[4], row[5]) if row[4] in CALENDAR else parse_period(row[4])
    return Budget(row[0], row[1], row[2], row[3], period, row[6] if len(row) > 6 else "")


BUDGET_COLUMNS = "id, group_id, key_id, amount, period, tz"


@dataclass(frozen=True, slots=True)
class Exceeded:
    """A budget a call does not fit in, for the 402."""

    budget: Budget
    used: int  # spent in the window plus held by calls in flight
    needed: int
    resets_at: float


class Windows:
    """The budgets of some keys and groups and their buckets' spend, as read at one moment: what the
    ledgers check a reservation against and add a settlement's charge to."""

    def __init__(self, budgets: Iterable[Budget], spend: Iterable[tuple[int, int, int]], now: float) -> None:
        self.now = now
        self.of_key: dict[int, list[Budget]] = {}
        self.of_group: dict[int, list[Budget]] = {}
        for b in budgets:
            if b.key_id is not None:
                self.of_key.setdefault(b.key_id, []).append(b)
            else:
                self.of_group.setdefault(b.group_id, []).append(b)
        self.spend: dict[int, dict[int, int]] = {}  # budget id -> bucket -> spent
        for budget_id, bucket, spent in spend:
            self.spend.setdefault(budget_id, {})[bucket] = spent
        self.added: dict[tuple[int, int], int] = {}  # (budget id, bucket) -> charged since read

    def keep(self, older: Windows) -> None:
        """Take each bucket's spend as the larger of this read's and ``older``'s: a gateway that alone
        spends from its store (SQLite) has added every charge to its view as it became durable, so a
        read that raced a settlement can only have missed one, never seen one the view lacks."""
        for budget_id, buckets in older.spend.items():
            mine = self.spend.get(budget_id)
            if mine is None:
                continue
            for bucket, spent in buckets.items():
                if spent > mine.get(bucket, 0):
                    mine[bucket] = spent

    def __bool__(self) -> bool:
        return bool(self.of_key or self.of_group)

    def spent(self, budget: Budget) -> int:
        first = budget.period.first(self.now)
        return sum(v for b, v in self.spend.get(budget.id, {}).items() if b >= first)

    def check(
        self, group_id: int, key_id: int, group_held: int, key_held: int, amount: int
    ) -> Exceeded | None:
        """The first budget of the key, then of the group, that ``amount`` more would exceed."""
        for budgets, held in (
            (self.of_key.get(key_id, ()), key_held),
            (self.of_group.get(group_id, ()), group_held),
        ):
            for budget in budgets:
                used = self.spent(budget) + held
                if used + amount > budget.amount:
                    buckets = self.spend.get(budget.id, {}).items()
                    return Exceeded(budget, used, amount, budget.period.resets_at(self.now, buckets))
        return None

    def charge(self, group_id: int, key_id: int, amount: int) -> None:
        """Add a settled charge to the current bucket of every budget of the key and the group."""
        if amount <= 0:
            return
        for budget in (*self.of_key.get(key_id, ()), *self.of_group.get(group_id, ())):
            bucket = budget.period.bucket(self.now)
            mine = self.spend.setdefault(budget.id, {})
            mine[bucket] = mine.get(bucket, 0) + amount
            self.added[budget.id, bucket] = self.added.get((budget.id, bucket), 0) + amount

    def rows(self) -> list[tuple[int, int, int]]:
        """(budget id, bucket, amount) charged since they were read, to add to ``budget_spend``."""
        return [(b, bucket, amount) for (b, bucket), amount in self.added.items()]


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# -- reading and writing them ------------------------------------------------------------------------
# The budgets of some groups (theirs and their keys') with the spend of the buckets their windows may
# count, in one statement: ``?`` marks for SQLite and Database.select, PostgreSQL's own below.
READ = (
    "SELECT b.id, b.group_id, b.key_id, b.amount, b.period, b.tz, g.name, s.bucket, s.spent FROM budgets b "
    "JOIN groups g ON g.id = b.group_id LEFT JOIN budget_spend s ON s.budget_id = b.id AND s.bucket >= ? - b.span "
    "WHERE b.group_id IN ({marks}) ORDER BY b.id"
)
READ_PG = (
    "SELECT b.id, b.group_id, b.key_id, b.amount, b.period, b.tz, g.name, s.bucket, s.spent "
    "FROM budgets b JOIN groups g ON g.id = b.group_id LEFT JOIN budget_spend s ON s.budget_id = b.id AND s.bucket >= $1::int8 - b.span "
    "WHERE b.group_id = ANY($2::int8[]) ORDER BY b.id"
)
ADD_SPEND = (
    "INSERT INTO budget_spend (budget_id, bucket, spent) VALUES (?, ?, ?) ON CONFLICT (budget_id, bucket) "
    "DO UPDATE SET spent = budget_spend.spent + excluded.spent"
)


def windows_of(rows: Iterable[Sequence[Any]], now: float) -> Windows:
    """Rows of :data:`READ` as :class:`Windows`."""
    found: dict[int, Budget] = {}
    spend: list[tuple[int, int, int]] = []
    for row in rows:
        if row[0] not in found:
            found[row[0]] = budget_row(row[:7])
        if row[7] is not None:
            spend.append((row[0], row[7], row[8]))
    return Windows(found.values(), spend, now)


def _read_sql(group_ids: Sequence[int]) -> str:
    return READ.format(marks=", ".join("?" * len(group_ids)))


def read_sync(db: Any, group_ids: Sequence[int], now: float) -> Windows:
    """On a sqlite3 connection (the SQLite store's settlements, in their transaction)."""
    if not group_ids:
        return Windows((), (), now)
    return windows_of(db.execute(_read_sql(group_ids), [int(now), *group_ids]).fetchall(), now)


def write_sync(db: Any, windows: Windows) -> None:
    rows = windows.rows()
    if rows:
        db.executemany(ADD_SPEND, rows)


async def read(database: Any, group_ids: Sequence[int], now: float) -> Windows:
    """Through a store's :class:`~billing.store.Database` (either dialect)."""
    if not group_ids:
        return Windows((), (), now)
    return windows_of(await database.select(_read_sql(group_ids), [int(now), *group_ids]), now)


# -- managing them (the CLI, the admin API, the console) ------------------------------------------------
@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget with its current window: spent (settled), when it resets."""

    budget: Budget
    group_name: str
    spent: int
    window_start: float
    resets_at: float

    def as_dict(self) -> dict[str, Any]:
        b = self.budget
        return {
            "id": b.id,
            "group": self.group_name,
            "key_id": b.key_id,
            "amount": to_credits(b.amount),
            "window": b.period.name,
            "calendar": b.period.calendar,
            "timezone": b.period.tz if b.period.calendar else None,
            "spent": to_credits(self.spent),
            "window_start": iso(self.window_start),
            "resets_at": iso(self.resets_at),
        }


async def add(
    store: Any, group: str, amount: int, window: str, key_id: int | None = None, tz: str = "UTC"
) -> Budget:
    """A new budget for ``group`` (or one of its keys): ``amount`` nano-credits per ``window``."""
    _positive(amount)
    period = parse_period(window, tz)
    found = await store.get_group(group)
    if found is None:
        raise BudgetError(f"no group named {group!r}")
    if key_id is not None:
        key = await store.get_key(key_id)
        if key is None or key.group_id != found.id:
            raise BudgetError(f"no key {key_id} in the group {group!r}")
    stored_tz = period.tz if period.calendar else "UTC"
    made = time.time()
    await store.database.write(
        "INSERT INTO budgets (group_id, key_id, amount, period, tz, span, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (found.id, key_id, amount, period.name, stored_tz, period.span, made),
    )
    rows = await store.database.select(
        f"SELECT {BUDGET_COLUMNS} FROM budgets WHERE group_id = ? AND created_at = ? "
        "ORDER BY id DESC LIMIT 1",
        (found.id, made),
    )
    return budget_row((*rows[0], found.name))


async def set_amount(store: Any, budget_id: int, amount: int) -> bool:
    """A budget's new amount (its window, and what was spent in it, stay): False if there is no such
    budget. A running gateway reads it at its next refresh of the group, as it reads a new budget."""
    _positive(amount)
    changed = await store.database.atomic(
        [("UPDATE budgets SET amount = ? WHERE id = ?", (amount, budget_id))]
    )
    return changed[0] > 0


async def remove(store: Any, budget_id: int) -> bool:
    changed = await store.database.atomic(
        [
            ("DELETE FROM budgets WHERE id = ?", (budget_id,)),
            ("DELETE FROM budget_spend WHERE budget_id = ?", (budget_id,)),
        ],
        chained=True,
    )
    return changed[0] > 0


def _positive(amount: int) -> None:
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise BudgetError("a budget's amount must be a positive number of credits")


async def states(store: Any, group: str | None = None, key_id: int | None = None) -> list[BudgetState]:
    """The budgets (of one group, or one key), each with its current window."""
    if group is None:
        groups = await store.list_groups()
    else:
        groups = [found] if (found := await store.get_group(group)) is not None else []
    names = {g.id: g.name for g in groups}
    windows = await read(store.database, sorted(names), store.clock())
    out: list[BudgetState] = []
    for budgets in (*windows.of_group.values(), *windows.of_key.values()):
        for b in budgets:
            if key_id is not None and b.key_id != key_id:
                continue
            now = windows.now
            spend = windows.spend.get(b.id, {})
            out.append(
                BudgetState(
                    b,
                    names[b.group_id],
                    windows.spent(b),
                    float(b.period.first(now)),
                    b.period.resets_at(now, spend.items()),
                )
            )
    return sorted(out, key=lambda s: s.budget.id)


async def state(store: Any, budget_id: int) -> BudgetState | None:
    """One budget with its current window (None: there is none with that id): its group's read alone."""
    rows = await store.database.select(
        "SELECT g.name FROM budgets b JOIN groups g ON g.id = b.group_id WHERE b.id = ?", (budget_id,)
    )
    if not rows:
        return None
    return next((s for s in await states(store, rows[0][0]) if s.budget.id == budget_id), None)
