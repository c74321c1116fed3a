"""Operators with roles, made with the CLI (``router operators``), over real HTTP on the console and
the admin API: a viewer sees and exports everything and changes nothing; an operator of one group
sees nothing of another (404, as if it did not exist), nothing across groups (the overview, the audit
log, the webhooks, every group's calls), and changes its own group; the audit names the operator;
a new password ends the operator's sessions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from billing.audit import Audit
from core.money import NANO
from tests.conftest import Stack
from tests.test_console import HI, MODEL, Client, console_stack

ROOT = Path(__file__).resolve().parent.parent
PASSWORDS = {"boss": "boss-password-1", "watcher": "watcher-password-1", "ops1": "ops1-password-1"}


def router(stack: Stack, *args: str, password: str | None = None) -> str:
    config = stack.tmp / "operators.toml"
    config.write_text(f'[store]\nurl = "{stack.settings.store.url}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "cli", "--config", str(config), "operators", *args],
        cwd=ROOT,
        input=(password + "\n") if password else None,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def logged_in(stack: Stack, name: str) -> Client:
    client = Client(stack)
    assert client.login(PASSWORDS[name], name).status == 303
    return client


def balance(stack: Stack, group: str) -> int:
    return stack.run(stack.store.get_group(group)).balance  # type: ignore[union-attr]


def test_roles_on_the_console_and_the_admin_api(tmp_path: Path) -> None:
    stack = console_stack(tmp_path)
    try:
        mine, other = stack.group(100), stack.group(100)
        for group in (mine, other):
            stack.client(stack.key(group=group)).chat.completions.create(model=MODEL, messages=HI)
        (my_key,), (their_key,) = (
            stack.run(stack.store.list_keys(mine)),
            stack.run(stack.store.list_keys(other)),
        )
        (their_call,) = [r.id for r in stack.run(stack.store.usage(group=other))]
        router(stack, "add", "boss", "--role", "admin", "--stdin", password=PASSWORDS["boss"])
        router(stack, "add", "watcher", "--role", "viewer", "--stdin", password=PASSWORDS["watcher"])
        router(
            stack, "add", "ops1", "--role", "operator", "--group", mine, "--stdin", password=PASSWORDS["ops1"]
        )
        listed = router(stack, "list")
        assert re.search(rf"ops1\s+operator\s+{mine}", listed) and re.search(
            r"watcher\s+viewer\s+\(every group\)", listed
        )
        tokens = {name: router(stack, "token", name).strip().splitlines()[-1] for name in ("watcher", "ops1")}
        assert all(t.startswith("mro-") for t in tokens.values())
        assert Client(stack).login("wrong-password-1", "ops1").status == 401

        # a viewer: sees and exports everything, changes nothing
        viewer = logged_in(stack, "watcher")
        assert viewer.get("/console/").status == 200 and viewer.get("/console/audit").status == 200
        groups = viewer.get("/console/groups").text
        assert mine in groups and other in groups and "watcher" in groups and "(viewer)" in groups
        assert viewer.get(f"/console/groups/{other}/calls.csv").status == 200
        refused = viewer.post(f"/console/groups/{mine}/topup", {"amount": "1"})
        assert (
            refused.status == 403 and "changes nothing" in refused.text and balance(stack, mine) < 100 * NANO
        )
        api = Client(stack)
        assert {g["name"] for g in api.api("GET", "/groups", token=tokens["watcher"]).json()["groups"]} >= {
            mine,
            other,
        }
        denied = api.api("POST", f"/groups/{mine}/topup", {"credits": "1"}, token=tokens["watcher"])
        assert denied.status == 403 and denied.json()["error"]["code"] == "read_only_role"

        # an operator of one group: nothing of the other, nothing across groups, its own group's changes
        ops = logged_in(stack, "ops1")
        start = ops.get("/console/")
        assert start.status == 303 and start.headers["location"].endswith("/console/groups")
        page = ops.get("/console/groups").text
        assert f">{mine}<" in page and other not in page
        for path in (
            f"/console/groups/{other}",
            f"/console/groups/{other}/calls",
            f"/console/keys/{their_key.id}",
            f"/console/calls/{their_call}",
            f"/console/groups/{other}/calls.csv",
        ):
            assert ops.get(path).status == 404, path
        for path in ("/console/audit", "/console/webhooks", "/console/calls"):
            assert ops.get(path).status == 403, path
        assert (
            other not in ops.get("/console/keys").text
            and f"/console/keys/{my_key.id}" in ops.get("/console/keys").text
        )
        before = balance(stack, other)
        assert (
            ops.post(f"/console/groups/{other}/topup", {"amount": "1"}).status == 404
            and balance(stack, other) == before
        )
        assert ops.post("/console/groups", {"name": "new-one", "credits": "1"}).status == 403
        was = balance(stack, mine)
        assert ops.post(f"/console/groups/{mine}/topup", {"amount": "2"}).status == 303
        assert balance(stack, mine) == was + 2 * NANO
        t = tokens["ops1"]
        assert [g["name"] for g in api.api("GET", "/groups", token=t).json()["groups"]] == [mine]
        for method, path, body in (
            ("GET", f"/groups/{other}", None),
            ("POST", f"/groups/{other}/topup", {"credits": "1"}),
            ("GET", f"/keys/{their_key.id}", None),
            ("GET", f"/groups/{other}/usage", None),
        ):
            assert api.api(method, path, body, token=t).status == 404, path
        for method, path, body in (
            ("GET", "/audit", None),
            ("POST", "/groups", {"name": "x1", "credits": "1"}),
            ("GET", "/webhooks", None),
        ):
            answer = api.api(method, path, body, token=t)
            assert answer.status == 403 and answer.json()["error"]["code"] == "admin_only", path
        assert api.api("POST", f"/groups/{mine}/topup", {"credits": "3"}, token=t).status == 200

        # the audit names who did what
        log: list[Any] = stack.run(Audit(stack.store.database).entries(20))
        actors = {(e.action, e.actor) for e in log}
        assert ("group.topup", "console:ops1 (127.0.0.1)") in actors and (
            "group.topup",
            "admin-api:ops1 (127.0.0.1)",
        ) in actors
        assert ("operator.add", next(e.actor for e in log if e.action == "operator.add")) in actors
        assert not any(PASSWORDS["ops1"] in repr(e) or tokens["ops1"] in repr(e) for e in log)

        # an admin operator may do what the built-in admin does; a new password ends ops1's sessions
        boss = logged_in(stack, "boss")
        assert boss.post("/console/groups", {"name": "made-by-boss", "credits": "1"}).status == 303
        router(stack, "password", "ops1", "--stdin", password="ops1-password-2")
        again = ops.get("/console/groups")
        assert again.status == 303 and "/console/login" in again.headers["location"]
        router(stack, "remove", "watcher")
        assert viewer.get("/console/groups").status == 303
        assert api.api("GET", "/groups", token=tokens["watcher"]).status == 401
    finally:
        stack.stop()


def test_an_admin_manages_operators_in_the_console(tmp_path: Path) -> None:
    stack = console_stack(tmp_path)
    try:
        mine = stack.group(100)
        router(stack, "add", "watcher", "--role", "viewer", "--stdin", password=PASSWORDS["watcher"])
        admin = Client(stack)
        assert admin.login().status == 303  # the built-in admin
        page = admin.get("/console/operators").text
        assert "watcher" in page and "Add an operator" in page
        bad = admin.post(
            "/console/operators",
            {"name": "carol", "role": "operator", "groups": "", "password": "carol-password-1"},
        )
        assert (
            bad.status == 400 and "needs the groups it operates" in bad.text and 'value="carol"' in bad.text
        )
        short = admin.post(
            "/console/operators", {"name": "carol", "role": "operator", "groups": mine, "password": "short"}
        )
        assert short.status == 400 and "at least 8 characters" in short.text
        made = admin.post(
            "/console/operators",
            {"name": "carol", "role": "operator", "groups": mine, "password": "carol-password-1"},
        )
        assert made.status == 303 and "ok=added" in made.headers["location"]
        carol = Client(stack)
        assert carol.login("carol-password-1", "carol").status == 303
        assert carol.get("/console/groups").status == 200
        assert (
            carol.get("/console/operators").status == 403
        )  # an operator of one group: nothing across groups
        assert carol.post("/console/operators/watcher/remove", {}).status == 403

        viewer = logged_in(stack, "watcher")  # sees the accounts, is offered no form, may change nothing
        seen = viewer.get("/console/operators")
        assert seen.status == 200 and "carol" in seen.text and "Add an operator" not in seen.text
        assert (
            viewer.post(
                "/console/operators/password", {"name": "carol", "password": "viewer-sets-this"}
            ).status
            == 403
        )

        assert (
            admin.post(
                "/console/operators/password", {"name": "carol", "password": "carol-password-2"}
            ).status
            == 303
        )
        assert carol.get("/console/groups").status == 303  # her session ended with the new password
        assert Client(stack).login("carol-password-1", "carol").status == 401
        assert Client(stack).login("carol-password-2", "carol").status == 303
        assert admin.post("/console/operators/carol/remove", {}).status == 303
        assert Client(stack).login("carol-password-2", "carol").status == 401
        assert admin.post("/console/operators/nobody-here/remove", {}).status == 404

        router(stack, "add", "boss", "--role", "admin", "--stdin", password=PASSWORDS["boss"])
        boss = logged_in(stack, "boss")
        himself = boss.post("/console/operators/boss/remove", {})
        assert himself.status == 400 and "signed in with" in himself.text
        log: list[Any] = stack.run(Audit(stack.store.database).entries(20))
        done = [(e.action, e.actor) for e in log if e.target == "operator:carol"]
        assert ("operator.add", "console:admin (127.0.0.1)") in done and (
            "operator.password",
            "console:admin (127.0.0.1)",
        ) in done
        assert ("operator.remove", "console:admin (127.0.0.1)") in done
        assert all("carol-password" not in json.dumps([e.before, e.after]) for e in log)
    finally:
        stack.stop()


@pytest.mark.parametrize(("per_ip", "overall"), [(50, 20), (5, 50)])
def test_a_viewer_cannot_guess_the_admin_password_past_the_accounts_limit(
    tmp_path: Path, per_ip: int, overall: int
) -> None:
    """A viewer's browser that had logged in was counted on its device alone, and the viewer's own
    login started that count again: 150 guesses at the admin password from 30 device cookies, each
    device logging in as the viewer between its guesses, were all checked. Now every attempt at an
    account counts in that account's window whatever the device (a cookie earned as the viewer is
    nothing at the admin account), and a login clears only its own account's count: past the lower
    of the two limits every guess is refused (429) unchecked, and the viewer still gets in."""
    stack = console_stack(tmp_path, login_attempts_per_ip=per_ip, login_attempts_global=overall)
    try:
        router(stack, "add", "watcher", "--role", "viewer", "--stdin", password=PASSWORDS["watcher"])
        admins = Client(stack)  # the admin's own browser: a device cookie for the admin account
        assert admins.login().status == 303 and admins.post("/console/logout", {}).status == 303
        statuses = []
        for _ in range(30):
            device = logged_in(stack, "watcher")
            assert "mr_console_device" in device.cookies and device.post("/console/logout", {}).status == 303
            for i in range(5):
                statuses.append(device.login(f"guess number {i}", "admin").status)
            assert device.login(PASSWORDS["watcher"], "watcher").status == 303  # the viewer's own login
        checked = min(per_ip, overall)
        assert statuses.count(401) == checked and statuses.count(429) == 150 - checked, statuses
        refused = Client(stack).login()
        assert (
            refused.status == 429
            and "Too many failed logins" in refused.text
            and int(refused.headers["retry-after"]) > 0
        )
        # the admin's own browser counts on its device, not the IP: in, unless the account's limit is full
        assert admins.login().status == (429 if overall <= per_ip else 303)
    finally:
        stack.stop()
