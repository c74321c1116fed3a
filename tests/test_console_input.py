"""Bad input to the console and its admin API: every one is a 4xx naming the field (JSON, OpenAI-shaped,
on the API; the form's error on the pages), never a plain-text 500."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Stack
from tests.test_console import TOKEN, Client, admin, console_stack


@pytest.fixture(scope="module")
def istack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = console_stack(tmp_path_factory.mktemp("console-input"))
    try:
        yield s
    finally:
        s.stop()


def _error(r: object) -> dict:
    body = r.json()  # type: ignore[attr-defined]
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]  # type: ignore[no-any-return]


def test_admin_api_query_numbers_out_of_range(istack: Stack) -> None:
    api = Client(istack)
    assert api.api("POST", "/groups", {"name": "numbers", "credits": "1"}).status == 201
    cases = [
        ("/groups/numbers/usage?before=99999999999999999999999", "before"),  # OverflowError in SQLite
        ("/groups/numbers/usage?after=9223372036854775808", "after"),
        ("/groups/numbers/usage?key=%C2%B2", "key"),  # "²".isdigit() is True, int("²") raises
        ("/groups/numbers/usage?limit=1e3", "limit"),
        ("/groups/numbers/usage?since=nan", "since"),
        ("/groups/numbers/usage?until=-inf", "until"),
        ("/groups/numbers/usage/buckets?width=nan", "width"),
        ("/groups/numbers/usage/buckets?width=inf", "width"),
        ("/groups/numbers/usage/buckets?width=1e400", "width"),
        ("/groups/numbers/usage/buckets?since=1e300", "since"),
        ("/keys/99999999999999999999999/usage?since=nan", None),
    ]
    for path, param in cases:
        r = api.api("GET", path)
        assert 400 <= r.status < 500, (path, r.status, r.text[:200])
        assert _error(r)["param"] == param, (path, r.text[:200])
    r = api.request(
        "POST",
        "/console/api/groups",
        b"[" * 5_000,
        {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    assert r.status == 400 and _error(r)["code"] == "invalid_json"
    r = api.request(
        "POST",
        "/console/api/groups",
        b'{"name": "\xff"}',
        {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    assert r.status == 400 and _error(r)["code"] == "invalid_json"


def test_console_pages_with_absurd_cursors(istack: Stack) -> None:
    web = admin(istack)
    assert Client(istack).api("POST", "/groups", {"name": "cursors", "credits": "1"}).status == 201
    for query in ("before=9999999999999999999", "after=%C2%B2", "key=99999999999999999999", "limit=%C2%B2"):
        r = web.get(f"/console/groups/cursors/usage?{query}")
        assert r.status < 500, (query, r.status, r.text[:300])
    for path in (
        "/console/groups/cursors/calls?page=%C2%B2&from=99999-01-01&stream=maybe&limit=10%00",
        "/console/groups/cursors/calls?to=0001-01-01&key=-1&after=-5",
        "/console/keys?period=%C2%B2&sort=x",
        "/console/batches?before=" + "x" * 5000 + "&status=%00",
        "/console/?from=1970-01-01&source=%FF",
        "/console/calls?request=" + "r" * 10_000,
        "/console/calls/99999999999999999999",
        "/console/calls/%C2%B2",
    ):
        r = web.get(path)
        assert 200 <= r.status < 500 and r.status != 500, (path[:80], r.status, r.text[:300])
    assert web.get("/console/keys/%C2%B2").status == 404
    assert web.get("/console/keys/99999999999999999999").status == 404


EXTREMES = [
    "5e-324",
    "1e308",
    "-1",
    "nan",
    "inf",
    "-inf",
    "99999999999999999999999",
    "1e400",
    "%C2%B2",
    "0x10",
]


def test_every_admin_api_query_number_answers_extremes_with_a_4xx_naming_it(istack: Stack) -> None:
    """Each number the admin API reads from a query string or a path, sent 5e-324, 1e308, -1, nan, inf,
    a 23-digit integer...: never a 5xx; out of its range, a 400 naming the parameter. (The buckets'
    width=5e-324 was a 500: 86400 // 5e-324 is inf, and int(inf) raises OverflowError.)"""
    api = Client(istack)
    assert api.api("POST", "/groups", {"name": "extremes", "credits": "1"}).status == 201
    key_id = api.api("POST", "/groups/extremes/keys", {"name": "k"}).json()["id"]
    hook = istack.run(istack.gateway.alerts.add_webhook("https://hooks.example/x", None, None, None, False))
    queries = {
        "/groups/extremes/usage": ("key", "since", "until", "before", "after", "limit"),
        "/groups/extremes/usage/buckets": ("width", "since", "until", "key"),
        f"/keys/{key_id}/usage": ("since", "until"),
        f"/webhooks/{hook.id}/deliveries": ("limit",),
        "/audit": ("before", "limit"),
        "/groups/extremes/users": ("key", "since", "until", "limit"),
    }
    in_range = {("since", "5e-324"), ("until", "5e-324")}  # a time at the epoch: a number from 0 to 1e11
    for path, names in queries.items():
        for name in names:
            for value in EXTREMES:
                r = api.api("GET", f"{path}?{name}={value}")
                assert r.status < 500, (path, name, value, r.status, r.text[:200])
                if (name, value) not in in_range:
                    assert r.status == 400 and _error(r)["param"] == name, (
                        path,
                        name,
                        value,
                        r.status,
                        r.text[:200],
                    )
    r = api.api("GET", "/groups/extremes/usage/buckets?width=5e-324")  # the request
    assert r.status == 400 and _error(r)["param"] == "width", r.text[:200]
    r = api.api("GET", "/groups/extremes/usage/buckets?since=2000&until=1000")
    assert r.status == 400 and _error(r)["param"] == "since", r.text[:200]
    assert api.api("GET", "/groups/extremes/usage/buckets?width=60&since=0&until=60000").status == 200
    for value in EXTREMES:  # ids in the path: not found, whatever they are
        for method, path in [
            ("GET", f"/keys/{value}"),
            ("GET", f"/keys/{value}/usage"),
            ("POST", f"/keys/{value}/revoke"),
            ("GET", f"/webhooks/{value}/deliveries"),
            ("DELETE", f"/webhooks/{value}"),
            ("DELETE", f"/budgets/{value}"),
        ]:
            r = api.api(method, path)
            assert r.status == 404, (method, path, r.status, r.text[:200])
    for key in (99999999999999999999999, 2**63, -1, 0, 1.5, True):  # a number in a body: the budget's key
        r = api.api("POST", "/groups/extremes/budgets", {"amount": "1", "window": "day", "key_id": key})
        assert r.status == 400 and _error(r)["param"] == "key_id", (key, r.status, r.text[:200])


def test_console_pages_answer_extreme_numbers_without_a_5xx(istack: Stack) -> None:
    web = admin(istack)
    assert Client(istack).api("POST", "/groups", {"name": "extreme-pages", "credits": "1"}).status == 201
    for page in (
        "/console/groups/extreme-pages/calls",
        "/console/groups/extreme-pages/calls.csv",
        "/console/calls",
        "/console/audit",
        "/console/batches",
        "/console/keys",
        "/console/",
    ):
        for name in ("page", "limit", "before", "after", "key", "from", "to"):
            for value in EXTREMES:
                r = web.get(f"{page}?{name}={value}")
                assert r.status < 500, (page, name, value, r.status, r.text[:200])


def test_every_admin_api_body_integer_past_64_bits_is_a_400_naming_it(istack: Stack) -> None:
    """A JSON integer has no size, and msgspec decodes 401 digits as a Python int: in ``grace_seconds`` (key
    rotate) and ``expiry_within`` (webhooks) it was a 500 (``float()`` of it raises OverflowError). Each
    field of each admin API body (router/openapi.py) sent such a number alone is a 400 naming it: the admin
    API reads its bodies with core.inputs.decode_json(bounded=True)."""
    from router.openapi import OPERATIONS

    api = Client(istack)
    assert api.api("POST", "/groups", {"name": "digits", "credits": "1"}).status == 201
    key_id = api.api("POST", "/groups/digits/keys", {"name": "k"}).json()["id"]
    budget = api.api("POST", "/groups/digits/budgets", {"amount": "1", "window": "day"}).json()
    ids = {"name": "digits", "key_id": key_id, "budget_id": budget["id"]}
    sent = 0
    for op in OPERATIONS:
        if op.auth != "admin" or not isinstance(op.body, dict):
            continue
        for field in op.body["properties"]:
            for number in (10**400, -(10**400), 2**63):
                r = api.api(
                    op.method.upper(), op.path.removeprefix("/console/api").format(**ids), {field: number}
                )
                assert r.status == 400 and _error(r)["param"] == field, (
                    op.path,
                    field,
                    r.status,
                    r.text[:300],
                )
                sent += 1
    assert sent >= 3 * 20
    r = api.api(
        "POST", f"/keys/{key_id}/rotate", {"grace_seconds": 2**63 - 1}
    )  # (within 64 bits: its own rule)
    assert r.status == 400 and _error(r)["param"] == "grace_seconds" and "30 days" in _error(r)["message"]
