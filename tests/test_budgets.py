"""Budgets with periods (billing/budgets.py): windows enforced in the reservation beside the balance,
on both stores (SQLite: held in the gateway's memory; PostgreSQL: in the locked batch), with a clock
the test moves instead of waiting for midnight."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from billing import budgets
from billing.backends import open_store
from billing.ledger import Ledger, ledger_for
from billing.store import Store, UsageRecord
from core.catalog import NANO, ConfigError
from core.config import parse_settings
from core.errors import InsufficientCredits

DAY = 86400


class FakeClock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture
async def ledger(store_url: str) -> AsyncIterator[tuple[Store, Ledger, FakeClock]]:
    store = open_store(store_url)
    clock = store.clock = FakeClock(datetime(2026, 3, 10, 22, 0, tzinfo=UTC).timestamp())  # type: ignore[assignment]
    await store.open()
    book = ledger_for(store)
    try:
        yield store, book, clock
    finally:
        await book.drain()
        await store.close()


async def _key(store: Store, group: str, credits: int) -> int:
    await store.create_group(group, credits * NANO)
    key = await store.create_key(group, "k", f"hash-{group}-{random.random()}", "sk-...")
    return key.id


async def _call(book: Ledger, group_id: int, key_id: int, amount: int, charge: int) -> None:
    held = await book.reserve(group_id, key_id, amount)
    record = UsageRecord(key_id=key_id, group_id=group_id, model="m", provider="p", credits=charge)
    await book.settle_soon(held, record)


async def test_a_daily_window_refuses_then_resets(ledger: tuple[Store, Ledger, FakeClock]) -> None:
    store, book, clock = ledger
    key_id = await _key(store, "daily", 100)
    group = await store.get_group("daily")
    assert group is not None
    await budgets.add(store, "daily", NANO, "day", key_id, tz="Asia/Seoul")  # 1 credit per Seoul day
    await _call(book, group.id, key_id, NANO * 4 // 10, NANO * 4 // 10)
    held = await book.reserve(group.id, key_id, NANO * 4 // 10)  # 0.4 spent + 0.4 held
    with pytest.raises(InsufficientCredits) as info:
        await book.reserve(group.id, key_id, NANO * 3 // 10)
    error = info.value
    assert error.code == "budget_exceeded"
    assert "1 credits per calendar day (Asia/Seoul)" in error.message and "0.2 are left" in error.message
    # 22:00 UTC on 10 March is 07:00 on 11 March in Seoul: the window ends at the next Seoul midnight
    assert (
        error.headers["x-budget-reset"] == "2026-03-11T15:00:00Z" == error.message.split("resets at ")[1][:20]
    )
    await book.settle_soon(
        held, UsageRecord(key_id=key_id, group_id=group.id, model="m", provider="p", credits=NANO // 10)
    )
    await _call(book, group.id, key_id, NANO // 2, NANO // 2)  # 0.5 spent: 0.5 more fits
    with pytest.raises(InsufficientCredits):
        await book.reserve(group.id, key_id, NANO // 10)
    clock.at += 17 * 3600 + 1  # past the Seoul midnight
    await _call(book, group.id, key_id, NANO, NANO)
    (state,) = await budgets.states(store, "daily")
    assert state.spent == NANO and state.window_start == datetime(2026, 3, 11, 15, tzinfo=UTC).timestamp()


async def test_group_and_rolling_windows(ledger: tuple[Store, Ledger, FakeClock]) -> None:
    store, book, clock = ledger
    key_id = await _key(store, "rolling", 100)
    group = await store.get_group("rolling")
    assert group is not None
    await budgets.add(store, "rolling", 2 * NANO, "1h")  # the group's: 2 credits in any hour
    await budgets.add(store, "rolling", 50 * NANO, "month")
    for _ in range(4):
        await _call(book, group.id, key_id, NANO // 2, NANO // 2)
    with pytest.raises(InsufficientCredits) as info:
        await book.reserve(group.id, key_id, 1)
    assert "2 credits per rolling 1h for group rolling" in info.value.message
    clock.at += 1800
    with pytest.raises(InsufficientCredits):
        await book.reserve(group.id, key_id, 1)  # still within the hour
    clock.at += 1800 + 150 + 1  # the hour, and the bucket it began in, are past
    await _call(book, group.id, key_id, NANO, NANO)


async def test_concurrent_calls_never_exceed_the_window(ledger: tuple[Store, Ledger, FakeClock]) -> None:
    store, book, _ = ledger
    key_id = await _key(store, "busy", 100)
    group = await store.get_group("busy")
    assert group is not None
    await budgets.add(store, "busy", 5 * NANO, "day", key_id)
    refused = 0

    async def one() -> None:
        nonlocal refused
        try:
            held = await book.reserve(group.id, key_id, NANO // 5)
        except InsufficientCredits as exc:
            assert exc.code == "budget_exceeded"
            refused += 1
            return
        await asyncio.sleep(random.random() / 100)
        await book.settle_soon(
            held,
            UsageRecord(
                key_id=key_id,
                group_id=group.id,
                model="m",
                provider="p",
                credits=random.randint(NANO // 10, NANO // 5),
            ),
        )

    await asyncio.gather(*(one() for _ in range(200)))
    await book.drain()
    (state,) = await budgets.states(store, "busy")
    g = await store.get_group("busy")
    assert g is not None and g.spent == state.spent <= 5 * NANO
    assert refused <= 200 - 25  # worst cases of 0.2: at least 25 fit in 5 credits (more once some settled)
    assert state.spent >= 25 * NANO // 10


@pytest.mark.parametrize("window", ["", "fortnight", "0h", "-1d", "400d", "1.5h"])
def test_unparseable_windows(window: str) -> None:
    with pytest.raises(budgets.BudgetError):
        budgets.parse_period(window)


def test_calendar_windows_in_a_zone_with_dst() -> None:
    week = budgets.parse_period("week", "Europe/Paris")
    now = datetime(2026, 3, 29, 12, tzinfo=UTC).timestamp()  # a Sunday, the day clocks go forward
    assert budgets.iso(week.bucket(now)) == "2026-03-22T23:00:00Z"  # Monday 00:00 CET
    assert budgets.iso(week.resets_at(now, [])) == "2026-03-29T22:00:00Z"  # Monday 00:00 CEST
    month = budgets.parse_period("month", "America/New_York")
    assert (
        budgets.iso(month.resets_at(datetime(2026, 12, 15, tzinfo=UTC).timestamp(), []))
        == "2027-01-01T05:00:00Z"
    )


async def test_a_call_is_never_charged_more_than_it_reserved(ledger: tuple[Store, Ledger, FakeClock]) -> None:
    """An upstream that overruns the output cap it was sent: the charge stops at the worst case the
    call reserved (what the balance, the key's cap and every budget window were checked against)."""
    from billing.ledger import Meter
    from core.catalog import Catalog
    from core.wire import TokenUsage

    store, book, _ = ledger
    key_id = await _key(store, "overrun", 10)
    group = await store.get_group("overrun")
    assert group is not None
    model = Catalog.load(None).resolve("openai/gpt-4o-mini")
    held = await book.reserve(group.id, key_id, 5_000)
    record = UsageRecord(key_id=key_id, group_id=group.id, model=model.id, provider="openai")
    meter = Meter(book, held, model, record, {})
    await meter.finish(TokenUsage(prompt=10, completion=100_000), "ok")
    assert meter.settled is not None and await meter.settled == 5_000 == record.credits


def test_the_cli_answers_bad_budgets_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/r.db"\n')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "--config", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert cli("groups", "create", "acme", "--credits", "10").returncode == 0
    for args, says in [
        (("--amount", "5", "--window", "fortnight"), "cannot parse the budget window 'fortnight'"),
        (("--amount", "-5", "--window", "day"), "must be a positive number of credits"),
        (("--amount", "five", "--window", "day"), "error: "),
        (("--amount", "5", "--window", "day", "--tz", "Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (("--amount", "5", "--window", "day", "--key", "42"), "no key 42 in the group 'acme'"),
    ]:
        out = cli("budgets", "add", "--group", "acme", *args)
        assert out.returncode != 0 and out.stderr.startswith("error: ") and says in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr  # one line, no traceback
    made = cli(
        "budgets", "add", "--group", "acme", "--amount", "2.5", "--window", "week", "--tz", "Asia/Seoul"
    )
    assert made.stdout.strip() == "budget 1: 2.5 credits per calendar week (Asia/Seoul) for group acme"
    assert "week (Asia/Seoul)" in cli("budgets", "list").stdout
    assert cli("budgets", "remove", "1").returncode == 0 and cli("budgets", "remove", "1").returncode != 0


def test_a_bad_billing_timezone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="billing.timezone: unknown time zone 'Nope/Zone'"):
        parse_settings({"billing": {"timezone": "Nope/Zone"}})


async def test_a_replayed_settlement_counts_in_its_window(ledger: tuple[Store, Ledger, FakeClock]) -> None:
    """A settlement journaled while the store was down and replayed later (billing/durable.py) is
    charged to its budgets' windows like any other."""
    from billing.journal import Entry

    store, book, _ = ledger
    key_id = await _key(store, "replayed", 10)
    group = await store.get_group("replayed")
    assert group is not None
    await budgets.add(store, "replayed", NANO, "day")
    held = await book.reserve(group.id, key_id, NANO // 2)
    record = UsageRecord(key_id=key_id, group_id=group.id, model="m", provider="p", credits=NANO // 4)
    done = await store.replay([Entry.new(held, record)])
    assert list(done.values()) == [True]
    (state,) = await budgets.states(store, "replayed")
    assert state.spent == NANO // 4
