"""The console end to end in a real headless Chromium (Debian's ``chromium``, driven by Playwright with
its ``executable_path``), with JavaScript turned off: the console needs none. Log in, create a group
and a key, call the gateway with that key through the OpenAI SDK, see the calls per key and in the
group's history, flip the Jobs/API toggle, revoke the key and see the next call refused.

Screenshots go to ``test-artifacts/console/``. Without ``/usr/bin/chromium`` this test fails (``.ci/run``
installs it)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import Stack
from tests.test_console import MODEL, PASSWORD, console_stack, job_record

CHROMIUM = os.environ.get("ROUTER_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
HI: Any = [{"role": "user", "content": "Hello from the browser test"}]


@pytest.fixture(scope="module")
def bstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = console_stack(tmp_path_factory.mktemp("console-browser"))
    try:
        yield s
    finally:
        s.stop()


def chromium_path() -> str:
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        pytest.fail(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium; .ci/run does)"
        )
    return path


def test_console_end_to_end_in_chromium(bstack: Stack, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{bstack.port}/console"
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=chromium_path(),
            headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            java_script_enabled=False,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)

            def shot(name: str) -> None:
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

            # nobody sees anything without logging in
            page.goto(base + "/groups")
            assert "/console/login" in page.url
            expect(page.get_by_role("heading", name="Log in")).to_be_visible()
            page.fill("#password", "not the password")
            page.click("button[type=submit]")
            expect(page.locator(".error-box")).to_have_text("Wrong password.")
            shot("01-login-error")
            page.fill("#password", PASSWORD)
            page.click("button[type=submit]")
            expect(page.get_by_role("heading", name="Groups")).to_be_visible()
            assert page.url.endswith("/console/groups")

            # a group, then a validation error on the form, then a key (shown once)
            page.fill("#name", "browser-team")
            page.fill("#credits", "25.5")
            page.click("text=Create group")
            expect(page.locator(".notice")).to_have_text("Group created.")
            expect(page.locator(".stats")).to_contain_text("25.5")
            page.goto(base + "/groups")
            expect(page.locator("table.data")).to_contain_text("browser-team")
            shot("02-groups")
            page.click("table.data >> text=browser-team")
            page.fill("#spend_cap", "a lot")
            page.click("text=Create key")
            expect(page.locator(".field-error")).to_contain_text("is not an amount of credits")
            shot("03-validation-error")
            page.fill("#label", "browser-key")
            page.fill("#spend_cap", "")
            page.click("text=Create key")
            key = page.locator("#new-key").inner_text().strip()
            assert re.fullmatch(r"sk-mr-v1-[A-Za-z0-9_-]{43}", key)
            shot("03-key-created-once")

            # calls through the OpenAI SDK with that key, and two calls made by a job
            client = bstack.client(key)
            for model in (MODEL, MODEL, "anthropic/claude-sonnet-4-6"):
                assert client.chat.completions.create(model=model, messages=HI).choices
            key_id = bstack.run(bstack.store.list_keys("browser-team"))[0].id
            for _ in range(2):
                job_record(
                    bstack, "browser-team", key_id, model="google/gemini-2.5-flash", credits=2_000_000_000
                )

            # per key: one row per model
            page.goto(f"{base}/groups/browser-team")
            expect(page.locator(".newkey")).to_have_count(0)  # the clear key is never shown again
            assert key not in page.content()
            page.click("#keys >> text=browser-key")
            rows = page.locator("#by-model tbody tr")
            expect(rows).to_have_count(3)
            expect(page.locator("#by-model")).to_contain_text("anthropic/claude-sonnet-4-6")
            expect(page.locator("#by-model tbody tr", has_text=MODEL).locator("td").nth(1)).to_have_text("2")
            expect(page.locator("#by-model tbody tr", has_text="gemini").locator("td").nth(7)).to_have_text(
                "4"
            )
            shot("04-key-usage")

            # the group's history: all five calls, then only the jobs' after flipping the toggle
            page.goto(f"{base}/groups/browser-team/usage")
            history = page.locator("#history tbody tr")
            expect(history).to_have_count(5)
            expect(page.locator("svg.chart")).to_be_visible()
            shot("05-usage-all")
            page.click("nav.toggle >> text=Jobs")
            expect(history).to_have_count(2)
            expect(page.locator("#history .tag.api")).to_have_count(0)
            expect(page.locator("#history .tag.job")).to_have_count(2)
            assert "source=job" in page.url
            shot("06-usage-jobs")
            page.click("nav.toggle >> text=API")
            expect(history).to_have_count(3)
            expect(page.locator("#history .tag.job")).to_have_count(0)

            # revoke: the very next SDK call is refused
            page.goto(f"{base}/groups/browser-team")
            page.click(f"button[aria-label='Revoke key {key_id}']")
            expect(page.locator(".notice")).to_contain_text("Key revoked")
            expect(page.locator("#keys .tag.off")).to_have_text("revoked")
            shot("07-key-revoked")
            with pytest.raises(openai.AuthenticationError):
                client.chat.completions.create(model=MODEL, messages=HI)

            # log out: the pages are closed again
            page.click("text=Log out")
            expect(page.get_by_role("heading", name="Log in")).to_be_visible()
            page.goto(base + "/groups/browser-team/usage")
            assert "/console/login" in page.url
        finally:
            context.close()
