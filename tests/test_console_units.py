"""The console's pure parts: periods and buckets on a zone's clock (DST, half-hour offsets), the chart
(round ticks, true-start labels, an empty state, hover figures), amounts shown to fixed decimals, amounts
typed with separators, the one-time flash's cipher."""

from __future__ import annotations

import datetime
import xml.etree.ElementTree as ET
from zoneinfo import ZoneInfo

import pytest

from console import charts, display, flash, forms, periods
from console.forms import Invalid

UTC, PARIS, INDIA = ZoneInfo("UTC"), ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Kolkata")


def at(text: str, zone: ZoneInfo = UTC) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def test_presets_are_whole_buckets_up_to_now() -> None:
    now = at("2026-11-23 07:55:10")
    day = periods.choose({"period": "24h"}, UTC, now)
    assert day.since == at("2026-11-22 08:00") and day.until is None
    b = periods.for_period(day, None, now, UTC)
    assert b is not None and len(b) == 24 and b.edges[-1] == at("2026-11-23 08:00")
    assert b.index(at("2026-11-23 07:55")) == 23 and b.label(23) == "07:00"  # not 06:00, not 07:54
    week = periods.choose({"period": "7d"}, UTC, now)
    assert week.since == at(
        "2026-11-16 09:00"
    )  # 56 buckets of 3 hours, starting on the clock's multiples of 3
    month = periods.choose({}, PARIS, now, default="30d")
    assert month.since == at("2026-10-25 00:00", PARIS)  # local midnights, across the DST change
    assert periods.choose({"period": "all"}, UTC, now).since is None
    with pytest.raises(Invalid):
        periods.choose({"period": "1y"}, UTC, now)


def test_dates_apply_without_a_menu_and_are_whole_local_days() -> None:
    p = periods.choose({"period": "24h", "from": "2026-03-29", "to": "2026-03-29"}, PARIS, 0.0)
    assert p.key == "custom" and p.since == at("2026-03-29 00:00", PARIS)
    assert p.until is not None and p.until - p.since == 23 * 3600  # the day the clocks go forward
    only_from = periods.choose({"from": "2026-01-01"}, UTC, 0.0)
    assert only_from.since == at("2026-01-01") and only_from.until is None
    for params in ({"from": "2026-13-01"}, {"to": "yesterday"}, {"from": "2026-02-02", "to": "2026-02-01"}):
        with pytest.raises(Invalid):
            periods.choose(params, UTC, 0.0)


def test_buckets_on_the_zones_clock() -> None:
    b = periods.buckets(at("2026-03-28 00:00", PARIS), at("2026-03-31 00:00", PARIS), PARIS, "day")
    assert [b.edges[i + 1] - b.edges[i] for i in range(len(b))] == [86400, 82800, 86400]  # 23 h on DST day
    assert [b.label(i) for i in range(len(b))] == ["Mar 28", "Mar 29", "Mar 30"]
    india = periods.buckets(at("2026-11-23 00:00", INDIA), at("2026-11-23 06:00", INDIA), INDIA, "hour")
    assert all(edge % 3600 == 0 for edge in india.edges)  # whole UTC hours: the hourly figures
    assert [india.label(i) for i in range(3)] == ["23:30", "00:30", "01:30"]  # labelled by their true start
    weeks = periods.buckets(at("2026-11-04"), at("2026-11-30"), UTC, "week")
    assert datetime.datetime.fromtimestamp(weeks.edges[0], UTC).weekday() == 0  # from Monday
    months = periods.buckets(at("2025-01-15"), at("2026-11-30"), UTC)
    assert months.unit == "month" and months.label(0) == "Jan 2025"
    assert periods.buckets(at("2026-11-20"), at("2026-11-23"), UTC).unit == "hour"  # the finest that fits
    hours = periods.buckets(at("2026-11-22 08:00"), at("2026-11-23 08:00"), UTC, "hour")
    assert [hours.label(i) for i in hours.ticks()] == [
        "09:00",
        "12:00",
        "15:00",
        "18:00",
        "21:00",
        "Nov 23",
        "03:00",
        "06:00",
    ]


def test_chart_ticks_labels_hover_and_empty_state() -> None:
    assert charts.nice_step(1.2e-9 * 4) == pytest.approx(1.2e-9) or charts.nice_step(4.8e-9) in (1e-9, 2e-9)
    assert (
        charts.nice_step(7) == 2
        and charts.nice_step(7, whole=True) == 2
        and charts.nice_step(0.5, whole=True) == 1
    )
    assert charts.nice_step(0.0075) == 0.002 and charts.nice_step(1875) == 500
    b = periods.buckets(at("2026-11-22 08:00"), at("2026-11-23 08:00"), UTC, "hour")
    points = [charts.Point(0, 0, 0)] * 23 + [charts.Point(21_329, 7_500_000, 3)]
    html = charts.svg(b, points, "test")
    wide = ET.fromstring(html.split("</svg>")[0] + "</svg>")  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    axis = [t.text for t in wide.iter(f"{ns}text") if t.get("class") == "axis credits"]
    assert axis == ["0.000", "0.002", "0.004", "0.006", "0.008"]  # round steps, every label as precise
    calls = [t.text for t in wide.iter(f"{ns}text") if t.get("class") == "axis calls"]
    assert calls == ["0", "10,000", "20,000", "30,000"]
    tips = [t.text for t in wide.iter(f"{ns}title")]
    assert "Mon 2026-11-23 07:00–08:00 (UTC): 21,329 calls (3 failed or rejected), 0.0075 credits" in tips
    assert f'data-start="{at("2026-11-23 07:00"):.0f}"' in html  # the figures' table, bucket by bucket
    empty = charts.svg(b, [charts.Point(0, 0, 0)] * 24, "test")
    assert "<svg" not in empty and "No calls in this period" in empty


def test_amounts_to_fixed_decimals_per_column() -> None:
    column = [4_350, 33_000, 2_500_000_123_456_789]
    assert display.places(column) == 7  # 0.0000330, the median, keeps three significant digits
    assert [display.fixed(n, 7) for n in column] == ["0.0000044", "0.0000330", "2,500,000.1234568"]
    # one tiny call among whole credits: the column keeps 2 decimals, the tiny one is "<0.01"
    whole = [12 * 10**9, 7 * 10**9, 30 * 10**9, 4_350]
    assert display.places(whole) == 2
    assert [display.fixed(n, 2) for n in whole] == ["12.00", "7.00", "30.00", "<0.01"]
    assert display.fixed(-4_350, 2) == ">-0.01" and display.fixed(0, 2) == "0.00"
    assert display.places([10**9, 2 * 10**9]) == 2 and display.fixed(12_345 * 10**9, 2) == "12,345.00"
    assert display.places([0, None]) == 2 and display.fixed(-1_500_000_000, 2) == "-1.50"
    assert display.exact(2_500_000_123_456_789) == "2500000.123456789"
    assert display.iso(at("2026-11-23 07:53:07.25")) == "2026-11-23T07:53:07.250Z"


def test_amounts_typed_with_separators() -> None:
    for text, nano in [
        ("1,000", 10**12),
        ("1 000.5", 1_000_500_000_000),
        ("2_500_000.123456789", 2_500_000_123_456_789),
        ("1\u00a0000", 10**12),
        ("12.5", 12_500_000_000),
    ]:
        assert forms.credits(text, "x") == nano, text
    for text in ("1,5", "1,00", "1,0000", "1.0000000001", "1e3", "--1"):
        with pytest.raises(Invalid):
            forms.credits(text, "x")


def test_flash_is_sealed_to_its_session() -> None:
    sealed = flash.seal("secret", "csrf-a", "token", "sk-mr-v1-abc")
    assert "sk-mr" not in sealed and "abc" not in bytes.fromhex(sealed).decode("latin-1")
    assert flash.unseal("secret", "csrf-a", "token", sealed) == "sk-mr-v1-abc"
    assert flash.unseal("secret", "csrf-b", "token", sealed) is None  # another session
    assert flash.unseal("other", "csrf-a", "token", sealed) is None
    assert flash.unseal("secret", "csrf-a", "token", sealed[:-2] + "00") is None  # tampered
