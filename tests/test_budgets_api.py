"""Budgets through the admin API, enforced on every endpoint (chat, Responses, a batch's lines), and
end users: ``user``, ``safety_identifier`` and ``metadata`` on the usage records, usage per user."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Stack
from tests.test_batches import request, submit, wait
from tests.test_console import Client, console_stack

MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="module")
def bstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = console_stack(tmp_path_factory.mktemp("budgets"))
    try:
        yield s
    finally:
        s.stop()


def _post(stack: Stack, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}{path}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"amount": "1", "window": "fortnight"}, "window"),
        ({"amount": "1", "window": "1.5h"}, "window"),
        ({"amount": "1", "window": None}, "window"),
        ({"amount": "-1", "window": "day"}, "amount"),
        ({"amount": "0", "window": "day"}, "amount"),
        ({"amount": "abc", "window": "day"}, "amount"),
        ({"amount": "1", "window": "day", "timezone": "Mars/Olympus"}, "timezone"),
        ({"amount": "1", "window": "day", "key_id": 999999}, "key_id"),
        ({"amount": "1", "window": "day", "key_id": "one"}, "key_id"),
    ],
)
def test_bad_budgets_are_400s_naming_the_field(bstack: Stack, data: dict[str, Any], field: str) -> None:
    group = bstack.group(1)
    answer = Client(bstack).api("POST", f"/groups/{group}/budgets", data)
    assert answer.status == 400, answer.text
    assert answer.json()["error"]["param"] == field


def test_a_budget_holds_on_every_endpoint_and_users_are_recorded(bstack: Stack, tmp_path: Path) -> None:
    group = bstack.group(100)
    key = bstack.key(group=group)
    api = Client(bstack)
    key_id = api.api("GET", f"/groups/{group}/keys").json()["keys"][0]["id"]
    made = api.api(
        "POST",
        f"/groups/{group}/budgets",
        {"amount": "0.0001", "window": "day", "key_id": key_id, "timezone": "Europe/Paris"},
    )
    assert made.status == 201, made.text
    budget = made.json()
    assert (budget["window"], budget["timezone"], budget["amount"], budget["spent"]) == (
        "day",
        "Europe/Paris",
        "0.0001",
        "0",
    )

    body = {
        "model": MODEL,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi [tokens:5]"}],
        "user": "alice",
        "safety_identifier": "hash-of-alice",
        "metadata": {"team": "red"},
    }
    first = _post(bstack, key, "/chat/completions", body)
    assert first.status_code == 200, first.text
    refusals: dict[str, httpx.Response] = {}
    for _ in range(60):  # until the day's budget refuses a chat call
        answer = _post(bstack, key, "/chat/completions", {**body, "user": "bob"})
        if answer.status_code == 402:
            refusals["chat"] = answer
            break
    assert "chat" in refusals
    # larger prompts than the chat calls' (so their worst case cannot fit what the day has left)
    long = "hi " * 300
    refusals["responses"] = _post(
        bstack, key, "/responses", {"model": MODEL, "input": long, "max_output_tokens": 20}
    )
    client = bstack.client(key)
    batch = wait(client, submit(client, [request("r1", MODEL, long, max_tokens=20)]).id)
    (line,) = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert line["error"]["code"] == "budget_exceeded"
    for name, refusal in refusals.items():
        error = refusal.json()["error"]
        assert refusal.status_code == 402 and error["code"] == "budget_exceeded", name
        assert "0.0001 credits per calendar day (Europe/Paris)" in error["message"]
        assert refusal.headers["x-budget-reset"] == budget["resets_at"]

    state = api.api("GET", f"/groups/{group}/budgets").json()["budgets"][0]
    records = api.api("GET", f"/groups/{group}/usage?limit=200").json()["data"]
    charged = sum(r["credits_nano"] for r in records)
    assert 0 < charged <= 100_000 and state["spent"] == f"{charged / 1e9:.9f}".rstrip("0")
    alice = [r for r in records if r["end_user"] == "alice"]
    assert [(r["safety_identifier"], json.loads(r["metadata"])) for r in alice] == [
        ("hash-of-alice", {"team": "red"})
    ]
    users = {u["user"]: u for u in api.api("GET", f"/groups/{group}/users").json()["users"]}
    assert set(users) == {"alice", "bob"} and users["alice"]["calls"] == 1
    assert sum(u["credits_nano"] for u in users.values()) == sum(
        r["credits_nano"] for r in records if r["end_user"]
    )

    web = Client(bstack)
    assert web.login().status == 303
    for page in (f"/console/groups/{group}", f"/console/keys/{key_id}"):  # the console shows it
        shown = web.get(page).text
        assert 'id="budgets"' in shown and "per calendar day (Europe/Paris)" in shown, page
    assert api.api("DELETE", f"/budgets/{budget['id']}").status == 200
    assert api.api("DELETE", f"/budgets/{budget['id']}").status == 404
    assert _post(bstack, key, "/chat/completions", body).status_code == 200  # no budget: the balance alone
