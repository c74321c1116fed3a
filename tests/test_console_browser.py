"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright with its
``executable_path``: no browser download), with seeded data: every page at 1440x900 and at 390x844
(no sideways scrolling, axe-core finds nothing serious or critical), then an operator's day: log in,
make a group and a key (a reload makes nothing again; the key is shown once, with a copy button),
call the gateway with it through the OpenAI SDK, flip the Jobs/API toggle and the filters (the rows
are the store's), read the chart's buckets (the store's hourly counts, on the clock), revoke the key
after the confirmation, switch to the browser's time zone, use the keyboard.

axe-core comes from npm (tests/clients, ``make install``) and is evaluated in each page. Screenshots go
to ``test-artifacts/console/`` (git-ignored). Without ``/usr/bin/chromium`` these tests fail
(``.ci/run`` installs it)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.usage_rows import load, rows_of
from billing import budgets
from billing.audit import Audit
from billing.store import UsageRecord
from console.auth import hash_password
from console.operators import Operators
from core.money import NANO
from tests.conftest import Stack
from tests.test_batches import request, submit, wait
from tests.test_console import HI, MODEL, PASSWORD, console_stack, job_record

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("ROUTER_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "console"
AXE = ROOT / "tests" / "clients" / "node_modules" / "axe-core" / "axe.min.js"
SIZES = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}
AXE_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(", ")}`);
}"""


def chromium_path() -> str:
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        pytest.fail(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium; .ci/run does)"
        )
    return path


def hour(ts: float) -> float:
    return ts // 3600 * 3600


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two busy groups and an empty one; SDK calls (streams, a user, refusals), a finished batch with a
    failed line and one that failed validation, job records, and records at chosen times yesterday."""
    s = console_stack(tmp_path_factory.mktemp("console-browser"))
    try:
        for name, credits in (("acme", 2_500_000.5), ("globex", 40), ("empty", 0)):
            s.group(credits, name=name)
        acme = s.client(s.key(group="acme", name="web", models=[MODEL, "anthropic/claude-sonnet-4-6"]))
        for n in range(8):
            acme.chat.completions.create(
                model=(MODEL, "anthropic/claude-sonnet-4-6")[n % 2],
                messages=HI,
                stream=n % 3 == 0,
                user="alice" if n < 4 else None,
            )
        for model in ("nobody/nothing", "google/gemini-2.5-flash"):
            with pytest.raises(openai.APIStatusError):
                acme.chat.completions.create(model=model, messages=HI)
        s.client(s.key(group="globex", name="ci")).chat.completions.create(model=MODEL, messages=HI)
        batcher = s.client(s.key(group="acme", name="batch"))
        done = wait(
            batcher, submit(batcher, [request("a", MODEL, "hi"), request("b", MODEL, "x [fault:500]")]).id
        )
        invalid = wait(batcher, submit(batcher, [request("x", MODEL, "hi"), {"custom_id": "y"}]).id)
        key_id = s.run(s.store.list_keys("acme"))[0].id
        group_id = s.run(s.store.get_group("acme")).id  # type: ignore[union-attr]
        for _ in range(3):
            job_record(s, "acme", key_id, model="google/gemini-2.5-flash", credits=2_000_000_000)
        yesterday = hour(time.time()) - 20 * 3600
        moments = [yesterday + 5 * 60, yesterday + 55 * 60, yesterday - 60, yesterday + 3600 + 1]
        s.run(
            load(
                s.store,
                rows_of(
                    UsageRecord(
                        key_id=key_id,
                        group_id=group_id,
                        model=MODEL,
                        provider="openai",
                        credits=1_234_567,
                        latency_ms=80.0,
                        ts=t,
                    )
                    for t in moments
                ),
            )
        )
        yield {
            "stack": s,
            "key_id": key_id,
            "group_id": group_id,
            "batch": done.id,
            "invalid": invalid.id,
            "moments": moments,
        }
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield b
        finally:
            b.close()


def logged_in(browser: Any, stack: Stack, **options: Any) -> tuple[Any, Any, str]:
    context = browser.new_context(viewport=SIZES["desktop"], **options)
    page = context.new_page()
    page.set_default_timeout(15_000)
    base = f"http://127.0.0.1:{stack.port}/console"
    page.goto(base + "/groups")
    assert "/console/login" in page.url
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/console/groups$"))
    return context, page, base


def test_every_page_on_desktop_and_phone_with_axe(browser: Any, seeded: dict[str, Any]) -> None:
    s = seeded["stack"]
    record = s.run(s.store.usage(group="acme", limit=1))[0]
    pages = {
        "overview": "/",
        "overview-jobs-90d": "/?period=90d&source=job",
        "groups": "/groups",
        "group": "/groups/acme",
        "group-empty": "/groups/empty",
        "group-keys": "/groups/acme/keys",
        "calls": "/groups/acme/calls?period=24h",
        "calls-filtered": "/groups/acme/calls?status=rejected&period=24h",
        "calls-oldest": "/groups/acme/calls?limit=25&after=0",
        "call": f"/calls/{record.id}",
        "find": "/calls?request=req_none",
        "calls-every": "/calls?period=24h",
        "keys": "/keys",
        "key": f"/keys/{seeded['key_id']}",
        "revoke": f"/keys/{seeded['key_id']}/revoke",
        "rotate": f"/keys/{seeded['key_id']}/rotate",
        "batches": "/batches",
        "batch": f"/batches/{seeded['batch']}",
        "batch-invalid": f"/batches/{seeded['invalid']}",
        "display": "/display",
        "audit": "/audit",
        "webhooks": "/webhooks",
        "operators": "/operators",
    }
    if s.run(Operators(s.store.database).get("ops-axe")) is None:
        s.run(
            Operators(s.store.database).add(
                "ops-axe", "operator", ["acme"], hash_password("ops-axe-password")
            )
        )
    axe = AXE.read_text()
    context, page, base = logged_in(browser, s)
    found: list[str] = []
    try:
        for size, viewport in SIZES.items():
            page.set_viewport_size(viewport)
            (ARTIFACTS / size).mkdir(parents=True, exist_ok=True)
            for name, path in pages.items():
                response = page.goto(base + path)
                assert response is not None and response.status == 200, (name, response and response.status)
                page.screenshot(path=str(ARTIFACTS / size / f"{name}.png"), full_page=True)
                wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert wide <= 1, f"{name} scrolls sideways by {wide}px at {size}"
                page.evaluate(axe)
                found += [f"{size} {name}: {v}" for v in page.evaluate(AXE_RUN)]
        assert not found, "\n".join(found)
    finally:
        context.close()


def test_an_operators_day(browser: Any, seeded: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    s = seeded["stack"]
    context, page, base = logged_in(browser, s, timezone_id="Asia/Kolkata")
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"day-{name}.png"), full_page=True)  # noqa: E731
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        # keyboard: the first Tab reaches the skip link, which is visible and goes to the content
        page.goto(base + "/")
        page.keyboard.press("Tab")
        expect(page.locator("a.skip")).to_be_focused()
        expect(page.locator("a.skip")).to_be_in_viewport()
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "content"

        # a group and a key: post/redirect/get, a reload makes nothing again
        page.goto(base + "/groups")
        page.fill("#name", "browser-team")
        page.fill("#credits", "1,000.5")
        page.click("text=Create group")
        expect(page.locator(".notice")).to_have_text("Group created.")
        page.reload()
        assert [g.name for g in s.run(s.store.list_groups())].count("browser-team") == 1
        page.click("nav.tabs >> text=Keys")
        page.fill("#label", "browser-key")
        page.click("text=Create key")
        key = page.locator("#new-key").inner_text().strip()
        assert re.fullmatch(r"sk-mr-v1-[A-Za-z0-9_-]{43}", key)
        page.click("button[data-copy]")
        expect(page.locator(".copied")).to_have_text("Copied.")
        assert page.evaluate("navigator.clipboard.readText()") == key
        shot("key-created-once")
        page.reload()
        expect(page.locator("#new-key")).to_have_count(0)
        assert len(s.run(s.store.list_keys("browser-team"))) == 1

        # calls with it, and their history: the toggle and a filter give the store's rows
        client = s.client(key)
        for model in (MODEL, MODEL, "anthropic/claude-sonnet-4-6"):
            assert client.chat.completions.create(model=model, messages=HI).choices
        key_id = s.run(s.store.list_keys("browser-team"))[0].id
        job_record(s, "browser-team", key_id, model="google/gemini-2.5-flash", credits=2_000_000_000)
        page.goto(base + "/groups/browser-team/calls")
        history = page.locator("#history tbody tr")
        expect(history).to_have_count(4)
        page.click("nav.toggle >> text=Jobs")
        expect(history).to_have_count(1)
        assert "source=job" in page.url
        expect(page.locator("#history .tag.api")).to_have_count(0)
        page.click("nav.toggle >> text=API")
        expect(history).to_have_count(3)
        page.click("summary >> text=Filters")
        page.fill("input[name=model]", "claude")
        page.click("#filters button[type=submit]")
        expect(history).to_have_count(1)
        assert "model=claude" in page.url and "source=api" in page.url  # kept in the address
        shot("calls-filtered")

        # the chart's buckets are the store's hourly counts, labelled on the browser's clock (India: :30)
        page.goto(base + "/groups/acme/calls?period=24h")
        page.click("summary >> text=The chart's figures")
        cells = page.locator("#chart-data tbody tr")
        starts = [float(x) for x in cells.evaluate_all("rows => rows.map(r => r.dataset.start)")]
        calls = [
            int(x.replace(",", ""))
            for x in cells.evaluate_all("rows => rows.map(r => r.cells[1].textContent)")
        ]
        assert len(starts) == 24 and all(b - a == 3600 for a, b in zip(starts, starts[1:], strict=False))
        db = s.run(
            s.store.database.select(
                "SELECT CAST(ts / 3600 AS INTEGER) * 3600, count(*) FROM usage WHERE group_id = ? AND ts >= ? GROUP BY 1",
                (seeded["group_id"], starts[0]),
            )
        )
        assert dict(zip(starts, calls, strict=True)) == {float(h): 0 for h in starts} | {
            float(h): n for h, n in db
        }
        first = cells.first.locator("td").first.inner_text()
        assert re.search(r"\d\d:00–\d\d:00$", first), (
            first
        )  # on UTC's clock: the browser's is not the page's yet
        shot("chart-utc")

        # the header's switch: the browser's own zone (Asia/Kolkata), remembered
        switch = page.locator("header button[data-local]")
        expect(switch).to_have_text(
            re.compile(r"Show Asia/(Kolkata|Calcutta) time")
        )  # (ICU may say Calcutta)
        switch.click()
        expect(page.locator(".zone-now")).to_have_text(re.compile(r"Times: Asia/(Kolkata|Calcutta)"))
        page.click("summary >> text=The chart's figures")
        assert re.search(
            r"\d\d:30–\d\d:30$", page.locator("#chart-data tbody tr").first.locator("td").first.inner_text()
        )
        shot("chart-india")
        page.click("header >> text=Show UTC")

        # budgets: added, edited and removed on the group's page; a bad amount's error is next to the field
        page.goto(base + "/groups/browser-team")
        expect(page.locator("#budgets")).to_contain_text("No budget yet")
        page.fill("#budget_amount", "1,5")
        page.click("text=Add budget")
        expect(page.locator("#budget_amount-error")).to_be_in_viewport()
        page.fill("#budget_amount", "0.000001")
        page.fill("#budget_window", "day")
        page.click("text=Add budget")
        expect(page.locator(".notice")).to_contain_text("Budget added")
        (budget,) = s.run(budgets.states(s.store, "browser-team"))
        assert budget.budget.amount == 1000 and budget.budget.period.name == "day"
        with pytest.raises(openai.APIStatusError) as refused:  # read by the ledger at its next refresh
            deadline = time.time() + 10
            while time.time() < deadline:
                client.chat.completions.create(model=MODEL, messages=HI)
                time.sleep(0.2)
        assert refused.value.status_code == 402 and refused.value.code == "budget_exceeded"  # type: ignore[attr-defined]
        page.fill(f"#budget_set_{budget.budget.id}", "1,000")
        page.click(f"#budgets form[action$='/budgets/{budget.budget.id}'] button")
        expect(page.locator(".notice")).to_contain_text("Budget changed")
        assert s.run(budgets.states(s.store, "browser-team"))[0].budget.amount == 1000 * NANO
        shot("budgets")
        page.click(f"#budgets form[action$='/budgets/{budget.budget.id}/remove'] button")
        expect(page.locator(".notice")).to_contain_text("Budget removed")
        expect(page.locator("#budgets")).to_contain_text("No budget yet")
        assert [e.action for e in s.run(Audit(s.store.database).entries())][:3] == [
            "budget.remove",
            "budget.update",
            "budget.add",
        ]

        # rotate: asked first, with the grace period said (24 hours unless given); the old secret still works
        page.goto(base + f"/keys/{key_id}")
        page.click("text=Rotate…")
        expect(page.locator("h1")).to_contain_text(f"Rotate key {key_id}")
        expect(page.locator(".confirm")).to_contain_text("keeps working for 24 hours")
        shot("rotate-confirm")
        page.click("text=Yes, rotate key")
        rotated = page.locator("#new-key").inner_text().strip()
        assert rotated != key and s.client(rotated).models.list().data
        assert client.models.list().data  # the old secret, within its day

        # revoke: asked first, then the very next SDK call is refused
        page.goto(base + "/groups/browser-team/keys")
        page.click(f"a[aria-label='Revoke key {key_id}']")
        expect(page.locator("h1")).to_contain_text(f"Revoke key {key_id}")
        shot("revoke-confirm")
        assert not s.run(s.store.get_key(key_id)).revoked_at  # type: ignore[union-attr]
        page.click("text=Yes, revoke key")
        expect(page.locator(".notice")).to_contain_text("Key revoked")
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=MODEL, messages=HI)

        # focus stays visible on the toggle (not clipped by its frame)
        page.goto(base + "/groups/acme/calls")
        page.focus("nav.toggle a >> nth=1")
        outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
        assert outline == "solid"
        page.click("text=Log out")
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    finally:
        context.close()


def test_a_viewer_and_a_group_operator_in_the_browser(browser: Any, seeded: dict[str, Any]) -> None:
    """Each signs in with their own name and password: the viewer sees everything and its change is
    refused; the operator of globex sees only globex, and acme's pages are not there for it."""
    from playwright.sync_api import expect

    from tests.test_operators import router

    s = seeded["stack"]
    router(s, "add", "vera", "--role", "viewer", "--stdin", password="vera-password-1")
    router(s, "add", "otto", "--role", "operator", "--group", "globex", "--stdin", password="otto-password-1")
    base = f"http://127.0.0.1:{s.port}/console"
    for name, password in (("vera", "vera-password-1"), ("otto", "otto-password-1")):
        context = browser.new_context(viewport=SIZES["desktop"])
        page = context.new_page()
        page.set_default_timeout(15_000)
        try:
            page.goto(base + "/login")
            page.fill("#name", name)
            page.fill("#password", password)
            page.click("button[type=submit]")
            expect(page.locator("header .who")).to_contain_text(name)
            if name == "vera":
                page.goto(base + "/groups/acme")
                expect(page.locator("h1")).to_have_text("acme")
                expect(page.locator("#amount")).to_have_count(0)  # no form it may not use
                expect(page.locator("#budget_amount")).to_have_count(0)
                expect(page.locator("main")).to_contain_text("Latest top-ups")  # what it may see
                before = s.run(s.store.get_group("acme")).balance  # type: ignore[union-attr]
                csrf = page.locator("input[name=csrf]").first.get_attribute("value")
                answer = page.request.post(
                    base + "/groups/acme/topup", form={"csrf": csrf or "", "amount": "5"}
                )
                assert (
                    answer.status == 403
                    and "changes nothing" in answer.text()
                    and s.run(s.store.get_group("acme")).balance == before
                )  # type: ignore[union-attr]
            else:
                page.goto(base + "/")
                page.wait_for_url(re.compile(r"/console/groups$"))
                expect(page.locator("main table")).to_contain_text("globex")
                expect(page.locator("main")).not_to_contain_text("acme")
                expect(page.locator("nav.main")).not_to_contain_text("Audit")
                response = page.goto(base + "/groups/acme")
                assert response is not None and response.status == 404
                response = page.goto(base + f"/keys/{seeded['key_id']}")  # acme's key
                assert response is not None and response.status == 404
            page.screenshot(path=str(ARTIFACTS / f"operator-{name}.png"), full_page=True)
        finally:
            context.close()
