"""The audit log: every change made through the admin API, the console's forms and the CLI is recorded
with who, when, what, before and after, readable in the admin API and on the console's page, and no
record ever holds a secret (a key's clear text or hash, the console password or its hash). On SQLite
and PostgreSQL (the admin API); the console and the CLI on SQLite."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from billing import budgets
from billing.audit import Audit
from billing.backends import open_store
from console import auth
from core.money import NANO
from gateway.auth import hash_key
from tests.conftest import Stack, run_sync
from tests.test_console import Client, admin, console_stack
from tests.test_key_lifecycle import TOKEN, call, lifecycle_stack


def api(stack: Stack, method: str, path: str, body: Any = None) -> Any:
    client = Client(stack)
    answer = client.api(method, path, body, token=TOKEN)
    assert answer.status in (200, 201), answer.text
    return answer.json()


def entries(stack: Stack, **query: str) -> list[dict[str, Any]]:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return list(api(stack, "GET", f"/audit?{q}")["data"])


def no_secret_in(text: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret ({secret[:12]}...) is in the audit log"


@pytest.fixture
def astack(store_url: str, tmp_path: Path) -> Any:
    stack = lifecycle_stack(tmp_path, store_url)
    try:
        yield stack
    finally:
        stack.close_clients()
        stack.stop()


def test_the_admin_api_records_each_change_with_before_and_after(astack: Stack) -> None:
    api(astack, "POST", "/groups", {"name": "audited", "credits": "10"})
    api(astack, "POST", "/groups/audited/topup", {"credits": "2.5"})
    made = api(astack, "POST", "/groups/audited/keys", {"name": "ci", "tags": ["ci"], "owner": "ana"})
    key_id, first = made["id"], made["key"]
    api(astack, "PATCH", f"/keys/{key_id}", {"spend_cap": "3", "expires_at": "30d", "owner": "bob"})
    rotated = api(astack, "POST", f"/keys/{key_id}/rotate", {"grace_seconds": 60})
    api(astack, "POST", f"/keys/{key_id}/revoke")
    log = entries(astack)
    assert [e["action"] for e in log] == [
        "key.revoke",
        "key.rotate",
        "key.update",
        "key.create",
        "group.topup",
        "group.create",
    ]
    assert all(e["actor"] == "admin-api:admin (127.0.0.1)" and e["ts"] > 0 for e in log)
    revoke, rotate, update, create, topup, group = log
    assert (
        group["before"] is None
        and group["after"]["balance"] == 10 * NANO
        and group["target"] == "group:audited"
    )
    assert topup["before"]["balance"] == 10 * NANO and topup["after"]["balance"] == 12.5 * NANO
    assert (
        create["before"] is None and create["after"]["tags"] == ["ci"] and create["target"] == f"key:{key_id}"
    )
    assert update["before"]["owner"] == "ana" and update["after"]["owner"] == "bob"
    assert update["before"]["spend_cap"] is None and update["after"]["spend_cap"] == 3 * NANO
    assert update["before"]["expires_at"] is None and update["after"]["expires_at"] > 0
    assert rotate["before"]["hint"] != rotate["after"]["hint"] and rotate["after"]["rotated_until"] > 0
    assert revoke["before"]["revoked_at"] is None and revoke["after"]["revoked_at"] > 0
    # filters: one target, one action
    assert [e["action"] for e in entries(astack, target=f"key:{key_id}")][-1] == "key.create"
    assert [e["target"] for e in entries(astack, action="group.topup")] == ["group:audited"]
    # never a secret: the clear keys and their hashes, anywhere in what the API shows or the table holds
    secrets = [first, rotated["key"], hash_key(first), hash_key(rotated["key"])]
    no_secret_in(json.dumps(log), secrets)
    rows = astack.run(
        astack.store.database.select("SELECT actor, action, target, before, after FROM audit_log")
    )
    no_secret_in(json.dumps(rows), secrets)


def test_a_refused_change_is_not_recorded(astack: Stack) -> None:
    group = astack.group(5)
    client = Client(astack)
    assert client.api("POST", f"/groups/{group}/topup", {"credits": "-1"}, token=TOKEN).status == 400
    assert (
        client.api("POST", f"/groups/{group}/keys", {"name": "x", "expires_at": 1}, token=TOKEN).status == 400
    )
    assert entries(astack) == []


def test_a_rotation_in_the_console_asks_first_and_keeps_the_old_secret_a_day_by_default(
    tmp_path: Path,
) -> None:
    """Rotate is a confirmation away, and an empty grace field is 24 hours, not 'at once': the old
    secret still answers after the rotation; a grace of 0 is said so before it is done."""
    stack = console_stack(tmp_path)
    try:
        client = admin(stack)
        made = client.post(
            f"/console/groups/{stack.group()}/keys", {"label": "web", "spend_cap": "", "models": ""}
        )
        old = re.search(r'id="new-key">([^<]+)<', client.get(made.headers["location"]).text).group(1)  # type: ignore[union-attr]
        key_id = re.search(r"key=(\d+)", made.headers["location"]).group(1)  # type: ignore[union-attr]
        key_page = client.get(f"/console/keys/{key_id}").text
        assert (
            f'<form method="get" action="/console/keys/{key_id}/rotate"' in key_page and "Rotate…" in key_page
        )
        unconfirmed = client.post(
            f"/console/keys/{key_id}/rotate", {"grace": ""}
        )  # no confirmation: nothing done
        assert unconfirmed.status == 303 and unconfirmed.headers["location"].endswith(
            f"/keys/{key_id}/rotate?grace=24h"
        )
        asked = client.get(unconfirmed.headers["location"])
        assert asked.status == 200 and "keeps working <strong>for 24 hours</strong>" in asked.text
        assert 'name="grace" value="24h"' in asked.text and call(stack, old) == "ok"
        at_once = client.get(f"/console/keys/{key_id}/rotate?grace=0")
        assert "stops working at once" in at_once.text
        bad = client.get(f"/console/keys/{key_id}/rotate?grace=soon")
        assert bad.status == 400 and "field-error" in bad.text and "grace" in bad.text
        done = client.post(f"/console/keys/{key_id}/rotate", {"grace": "24h", "confirm": "yes"})
        assert done.status == 303 and "rotated=" in done.headers["location"]
        new = re.search(r'id="new-key">([^<]+)<', client.get(done.headers["location"]).text).group(1)  # type: ignore[union-attr]
        assert (
            new != old and call(stack, new) == "ok" and call(stack, old) == "ok"
        )  # the old one, within its day
        assert [e["action"] for e in entries(stack)][:1] == ["key.rotate"]
    finally:
        stack.stop()


def test_budgets_are_set_in_the_console_on_the_key_and_only_through_their_owners_page(tmp_path: Path) -> None:
    stack = console_stack(tmp_path)
    try:
        client = admin(stack)
        mine, other = stack.group(), stack.group()
        stack.key(group=mine)
        (key,) = stack.run(stack.store.list_keys(mine))
        page = client.get(f"/console/keys/{key.id}")
        assert 'id="budgets"' in page.text and "No budget yet" in page.text  # shown before any exists
        bad = client.post(
            f"/console/keys/{key.id}/budgets", {"budget_amount": "5", "budget_window": "fortnight"}
        )
        assert bad.status == 400 and 'id="budget_window-error"' in bad.text and "autofocus" in bad.text
        made = client.post(f"/console/keys/{key.id}/budgets", {"budget_amount": "5", "budget_window": "7d"})
        assert made.status == 303 and made.headers["location"].endswith(
            f"/keys/{key.id}?ok=budget-added#budgets"
        )
        (state,) = stack.run(budgets.states(stack.store, mine))
        assert (state.budget.key_id, state.budget.amount, state.budget.period.name) == (
            key.id,
            5 * NANO,
            "7d",
        )
        shown = client.get(f"/console/keys/{key.id}").text
        assert state.budget.period.describe() in shown and 'placeholder="5"' in shown
        # another group's page cannot reach it
        assert (
            client.post(f"/console/groups/{other}/budgets/{state.budget.id}", {"amount": "1"}).status == 404
        )
        assert client.post(f"/console/groups/{other}/budgets/{state.budget.id}/remove", {}).status == 404
        bad_amount = client.post(f"/console/groups/{mine}/budgets/{state.budget.id}", {"amount": "-1"})
        assert bad_amount.status == 400 and f'id="budget_set_{state.budget.id}-error"' in bad_amount.text
        assert (
            client.post(f"/console/groups/{mine}/budgets/{state.budget.id}", {"amount": "7.5"}).status == 303
        )
        assert stack.run(budgets.states(stack.store, mine))[0].budget.amount == 7_500_000_000
        assert client.post(f"/console/keys/{key.id}/budgets/{state.budget.id}/remove", {}).status == 303
        assert stack.run(budgets.states(stack.store, mine)) == []
        actions = [e["action"] for e in entries(stack)]
        assert actions[:3] == ["budget.remove", "budget.update", "budget.add"]
    finally:
        stack.stop()


def test_the_console_records_its_changes_and_shows_them(tmp_path: Path) -> None:
    stack = console_stack(tmp_path)
    try:
        client = admin(stack)
        assert client.post("/console/groups", {"name": "formed", "credits": "4"}).status == 303
        assert client.post("/console/groups/formed/topup", {"amount": "1"}).status == 303
        topups = client.get("/console/groups/formed").text
        assert 'id="topups"' in topups and ">1.00<" in topups and ">5.00<" in topups  # added, balance after
        made = client.post("/console/groups/formed/keys", {"label": "web", "spend_cap": "", "models": ""})
        assert made.status == 303
        page = client.get(made.headers["location"])
        clear = re.search(r'id="new-key">([^<]+)<', page.text)
        assert clear, page.text[:400]
        key_id = re.search(r"key=(\d+)", made.headers["location"]).group(1)  # type: ignore[union-attr]
        assert (
            client.post(
                f"/console/keys/{key_id}/lifecycle", {"expires_at": "7d", "tags": "web, prod", "owner": "ops"}
            ).status
            == 303
        )
        rotated = client.post(f"/console/keys/{key_id}/rotate", {"grace": "10m", "confirm": "yes"})
        assert rotated.status == 303
        shown = client.get(rotated.headers["location"])
        secret = re.search(r'id="new-key">([^<]+)<', shown.text)
        assert secret and "rotated" in shown.text
        assert client.get(rotated.headers["location"]).text.count(secret.group(1)) == 0  # shown once
        assert client.post(f"/console/keys/{key_id}/revoke", {"confirm": "yes"}).status == 303
        log = entries(stack)
        assert [e["action"] for e in log] == [
            "key.revoke",
            "key.rotate",
            "key.update",
            "key.create",
            "group.topup",
            "group.create",
        ]
        assert all(e["actor"] == "console:admin (127.0.0.1)" for e in log)
        assert log[2]["after"]["tags"] == ["web", "prod"] and log[2]["before"]["tags"] == []
        page = client.get("/console/audit")
        assert page.status == 200 and "key.rotate" in page.text and "group:formed" in page.text
        assert "ops" in page.text  # the owner's change, before -> after
        assert "4.00 credits" in page.text and "4000000000" not in page.text  # amounts for humans, not nano
        assert not re.search(r"created_at</code>: [^<]*\d{10}\.\d", page.text)  # times, not Unix timestamps
        no_secret_in(page.text + json.dumps(log), [clear.group(1), secret.group(1), hash_key(clear.group(1))])
        # the keys page shows expiry, last used and tags
        listing = client.get("/console/keys")
        assert "prod" in listing.text and "Last used" in listing.text and "Expires" in listing.text
    finally:
        stack.close_clients()
        stack.stop()


def router_cli(*args: str, cwd: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        input=stdin,
    )


def test_the_cli_records_its_changes_as_the_os_user(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    assert router_cli("groups", "create", "shell", "--credits", "3", cwd=cwd).returncode == 0
    assert router_cli("groups", "topup", "shell", "2", cwd=cwd).returncode == 0
    made = router_cli("keys", "create", "--group", "shell", "--owner", "me", cwd=cwd)
    key = made.stdout.strip().splitlines()[-1]
    rotated = router_cli("keys", "rotate", "1", "--grace", "5m", cwd=cwd).stdout.strip().splitlines()[-1]
    assert router_cli("keys", "update", "1", "--tags", "batch", cwd=cwd).returncode == 0
    assert router_cli("keys", "revoke", "1", cwd=cwd).returncode == 0
    password = "a long enough console password"
    assert router_cli("console", "set-password", "--stdin", cwd=cwd, stdin=password + "\n").returncode == 0

    async def read() -> list[Any]:
        store = open_store(f"sqlite:///{tmp_path}/data/router.db")
        await store.open()
        try:
            return [e.json() for e in await Audit(store.database).entries()]
        finally:
            await store.close()

    log = run_sync(read())
    assert [e["action"] for e in log] == [
        "settings.console_password",
        "key.revoke",
        "key.update",
        "key.rotate",
        "key.create",
        "group.topup",
        "group.create",
    ]
    assert all(e["actor"] == f"cli:{getpass.getuser()}" for e in log)
    assert log[0]["after"] == {"set": True}
    no_secret_in(json.dumps(log), [key, rotated, hash_key(key), hash_key(rotated), password])
    stored = run_sync(_password_hash(tmp_path))
    no_secret_in(json.dumps(log), [stored])


async def _password_hash(tmp_path: Path) -> str:
    store = open_store(f"sqlite:///{tmp_path}/data/router.db")
    await store.open()
    try:
        rows = await store.database.select(
            "SELECT value FROM console_settings WHERE name = ?", (auth.PASSWORD_SETTING,)
        )
        return str(rows[0][0])
    finally:
        await store.close()


def test_budget_changes_are_recorded(astack: Stack) -> None:
    api(astack, "POST", "/groups", {"name": "budgeted", "credits": "10"})
    made = api(astack, "POST", "/groups/budgeted/budgets", {"amount": "2", "window": "day"})
    changed = api(astack, "PATCH", f"/budgets/{made['id']}", {"amount": "3.5"})
    assert (changed["amount"], changed["window"], changed["id"]) == ("3.5", "day", made["id"])
    api(astack, "DELETE", f"/budgets/{made['id']}")
    removed, updated, added = entries(astack, target=f"budget:{made['id']}")
    assert (added["action"], updated["action"], removed["action"]) == (
        "budget.add",
        "budget.update",
        "budget.remove",
    )
    assert updated["before"]["amount"] == "2" and updated["after"]["amount"] == "3.5"
    assert added["before"] is None and added["after"]["amount"] == "2" and added["after"]["window"] == "day"
    assert removed["before"]["group"] == "budgeted" and removed["after"] is None
