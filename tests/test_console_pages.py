"""The console's pages over real HTTP, checked against the store: forms answer with a redirect and a
reload repeats nothing (post/redirect/get), a new key is shown once after its redirect, revoking asks
first; the calls page's toggle, filters, pages and CSV give exactly the records the store has; the
overview's and a group's figures are the records' sums; a call, a batch and the keys have pages."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from core.money import to_credits
from tests.conftest import Stack
from tests.test_batches import request, submit, wait
from tests.test_console import HI, MODEL, Client, admin, console_of, console_stack, job_record, texts


@pytest.fixture(scope="module")
def cstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = console_stack(tmp_path_factory.mktemp("console-pages"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def web(cstack: Stack) -> Iterator[Client]:
    console_of(cstack).throttle.succeeded("127.0.0.1")
    yield admin(cstack)
    cstack.close_clients()


def rows(html: str, table: str) -> list[str]:
    """The body rows of the table with this id (an empty-state row is no row)."""
    body = html.split(f'id="{table}"')[1].split("<tbody>")[1].split("</tbody>")[0]
    return [r for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S) if 'class="empty"' not in r]


def sql(stack: Stack, query: str, *args: Any) -> list[tuple[Any, ...]]:
    return stack.run(stack.store.database.select(query, args))


def follow(web: Client, response: Any) -> Any:
    assert response.status == 303, (response.status, texts(response.text)[:300])
    return web.get(response.headers["location"])


# -- forms: post/redirect/get ------------------------------------------------------------------------
def test_groups_amounts_with_separators_and_a_reload_repeats_nothing(cstack: Stack, web: Client) -> None:
    created = web.post("/console/groups", {"name": "acme-prg", "credits": "1,000,000.5"})
    assert created.headers["location"] == "/console/groups/acme-prg?ok=created"
    page = follow(web, created)
    assert "Group created." in page.text and "1,000,000.50" in page.text  # separators, fixed decimals
    assert web.get(created.headers["location"]).status == 200  # the reload is a GET: nothing made again
    assert cstack.run(cstack.store.get_group("acme-prg")).balance == 1_000_000_500_000_000  # type: ignore[union-attr]
    for amount in ("1 000", "2_000", "3,000.25"):
        assert web.post("/console/groups/acme-prg/topup", {"amount": amount, "back": "group"}).status == 303
    assert cstack.run(cstack.store.get_group("acme-prg")).balance == 1_006_000_750_000_000  # type: ignore[union-attr]
    for amount, message in [
        ("1,5", "use a point for decimals"),
        ("12,34,5", "use a point"),
        ("-5", "is not an amount"),
        ("0", "more than zero"),
        ("", "Enter an amount"),
    ]:
        r = web.post("/console/groups/acme-prg/topup", {"amount": amount, "back": "list"})
        assert r.status == 400 and message in texts(r.text), (amount, texts(r.text)[:200])
    for fields, message in [
        ({"name": "bad name!", "credits": "1"}, "A group name is 1 to 64"),
        ({"name": "acme-prg", "credits": "1"}, "already exists"),
    ]:
        r = web.post("/console/groups", fields)
        assert r.status == 400 and message in texts(r.text) and 'aria-invalid="true"' in r.text
    assert web.get("/console/groups/nobody").status == 404 and web.get("/console/nothing-here").status == 404


def test_a_new_key_is_shown_once_after_the_redirect(cstack: Stack, web: Client) -> None:
    group = cstack.group(50)
    made = web.post(f"/console/groups/{group}/keys", {"label": "ci", "spend_cap": "1,000", "models": ""})
    assert made.status == 303 and "created=" in made.headers["location"]  # no key in the address
    page = web.get(made.headers["location"])
    key = re.search(r'id="new-key">([^<]+)<', page.text).group(1)  # type: ignore[union-attr]
    assert key.startswith("sk-mr-v1-") and key not in made.headers["location"] and "data-copy" in page.text
    again = web.get(made.headers["location"])  # a reload: the key is gone, and no other key was made
    assert key not in again.text and 'id="new-key"' not in again.text
    (info,) = cstack.run(cstack.store.list_keys(group))
    assert info.spend_cap == 1_000 * 10**9 and info.name == "ci"
    assert cstack.client(key).chat.completions.create(model=MODEL, messages=HI).choices
    other = admin(cstack)  # another session cannot read it either
    token = made.headers["location"].split("created=")[1].split("&")[0]
    assert key not in other.get(f"/console/groups/{group}/keys?created={token}").text
    for fields, message in [
        ({"label": "x", "spend_cap": "lots"}, "is not an amount of credits"),
        ({"label": "x", "models": "openai/no-such-model"}, "Unknown model"),
        ({"label": "x" * 65}, "at most 64"),
    ]:
        bad = web.post(f"/console/groups/{group}/keys", fields)
        assert bad.status == 400 and message in texts(bad.text)
    assert len(cstack.run(cstack.store.list_keys(group))) == 1


def test_revoke_asks_first_and_caps_apply_at_once(cstack: Stack, web: Client) -> None:
    group = cstack.group(50)
    key = cstack.key(group=group)
    (info,) = cstack.run(cstack.store.list_keys(group))
    client = cstack.client(key)
    listing = web.get(f"/console/groups/{group}/keys")
    assert f'href="/console/keys/{info.id}/revoke"' in listing.text and '/revoke" class' not in listing.text
    assert f'action="/console/keys/{info.id}/revoke"' not in listing.text  # no one-click revoke
    confirm = web.get(f"/console/keys/{info.id}/revoke")
    assert "cannot be undone" in confirm.text and 'name="confirm" value="yes"' in confirm.text
    unconfirmed = web.post(f"/console/keys/{info.id}/revoke", {})  # a form without the confirmation
    assert unconfirmed.headers["location"] == f"/console/keys/{info.id}/revoke"
    assert not cstack.run(cstack.store.get_key(info.id)).revoked_at  # type: ignore[union-attr]
    ok = web.post(
        f"/console/keys/{info.id}/update", {"spend_cap": "2.5", "models": "anthropic/claude-sonnet-4-6\n"}
    )
    assert "Key updated." in follow(web, ok).text
    with pytest.raises(openai.PermissionDeniedError):  # applied at once, not after the auth cache expires
        client.chat.completions.create(model=MODEL, messages=HI)
    assert web.post(f"/console/keys/{info.id}/update", {"spend_cap": "", "models": ""}).status == 303
    assert client.chat.completions.create(model=MODEL, messages=HI).choices
    revoked = web.post(f"/console/keys/{info.id}/revoke", {"confirm": "yes"})
    assert "Key revoked" in follow(web, revoked).text
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=HI)
    assert "was revoked" in web.get(f"/console/keys/{info.id}/revoke").text


# -- the calls --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def busy(cstack: Stack) -> dict[str, Any]:
    """A group with calls of every kind: several models and keys, streams, a user, refusals, jobs."""
    group = cstack.group(100)
    k1 = cstack.key(
        group=group, name="one", models=[MODEL, "anthropic/claude-sonnet-4-6", "anthropic/claude-haiku-4-5"]
    )
    k2 = cstack.key(group=group, name="two")
    keys = cstack.run(cstack.store.list_keys(group))
    c1, c2 = cstack.client(k1), cstack.client(k2)
    for n in range(6):
        c1.chat.completions.create(
            model=(MODEL, "anthropic/claude-sonnet-4-6")[n % 2],
            messages=HI,
            stream=n == 1,
            user="alice" if n < 3 else None,
        )
    c2.chat.completions.create(model="anthropic/claude-haiku-4-5", messages=HI)
    c2.chat.completions.create(model="mistral/mistral-small-latest", messages=HI, user="bob")
    for model in ("google/gemini-2.5-flash", "nobody/nothing"):  # refused: not allowed, unknown
        with pytest.raises(openai.APIStatusError):
            c1.chat.completions.create(model=model, messages=HI)
    for _ in range(2):
        job_record(cstack, group, keys[1].id, credits=5_000_000_001, batch_id="batch_pages")
    return {"group": group, "keys": keys}


def test_calls_toggle_and_filters_match_the_store(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    group, keys = busy["group"], busy["keys"]
    gid = cstack.run(cstack.store.get_group(group)).id  # type: ignore[union-attr]
    base = f"/console/groups/{group}/calls"

    def count(where: str = "1 = 1", *args: Any) -> int:
        return int(
            sql(cstack, f"SELECT count(*) FROM usage WHERE group_id = ? AND {where}", gid, *args)[0][0]
        )

    assert len(rows(web.get(base).text, "history")) == count() == 12
    for query, where, args in [
        ("source=job", "source = ?", ("job",)),
        ("source=api", "source = ?", ("api",)),
        ("status=rejected", "status = ?", ("rejected",)),
        ("status=ok&source=api", "status = 'ok' AND source = ?", ("api",)),
        ("provider=anthropic", "provider = ?", ("anthropic",)),
        ("stream=yes", "stream = ?", (1,)),
        ("user=alice", "end_user = ?", ("alice",)),
        (f"key={keys[1].id}", "key_id = ?", (keys[1].id,)),
        ("batch=batch_pages", "batch_id = ?", ("batch_pages",)),
        ("model=claude", "model LIKE ?", ("anthropic/claude%",)),  # a prefix of the name
        ("model=anthropic/", "model LIKE ?", ("anthropic/%",)),  # of the id
        ("model=claude-sonnet-4-6", "model = ?", ("anthropic/claude-sonnet-4-6",)),
        ("model=nobody/nothing", "model = ?", ("nobody/nothing",)),  # a refused call's unknown model
        ("endpoint=chat&status=ok", "endpoint = 'chat' AND status = ?", ("ok",)),
    ]:
        page = web.get(f"{base}?{query}")
        assert page.status == 200 and len(rows(page.text, "history")) == count(where, *args) > 0, query
        assert f"<strong>{count(where, *args)}</strong> calls" in page.text, query  # the chart's total too
    jobs = web.get(base + "?source=job")
    assert 'aria-current="true">Jobs' in jobs.text and 'class="tag api"' not in rows(jobs.text, "history")[0]
    rejected = web.get(base + "?status=rejected").text
    assert "model_not_found" in rejected and "model_not_allowed" in rejected
    none = web.get(base + "?model=gpt-99")
    assert none.status == 400 and "No model matches" in texts(none.text) and not rows(none.text, "history")
    past = web.get(base + "?from=2020-01-01&to=2020-01-31")  # dates apply without choosing "custom"
    assert not rows(past.text, "history") and "No calls in this period" in past.text
    bad = web.get(base + "?from=2020-13-45&status=maybe&key=x")
    assert (
        bad.status == 400
        and "Use a date as YYYY-MM-DD" in texts(bad.text)
        and "The status is one of" in texts(bad.text)
    )
    assert 'value="2020-01-01"' in past.text  # the filters stay in the page's address and forms


def test_calls_pages_oldest_and_csv(cstack: Stack, web: Client) -> None:
    group = cstack.group(100)
    cstack.key(group=group)
    (info,) = cstack.run(cstack.store.list_keys(group))
    for n in range(60):
        job_record(cstack, group, info.id, credits=1000 + n)
    base = f"/console/groups/{group}/calls?limit=25"
    first = web.get(base)
    assert "Page 1 of 3" in texts(first.text) and "(60 calls)" in texts(first.text)
    older = re.search(r'href="([^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    second = web.get(older)
    assert "Page 2 of 3" in texts(second.text) and len(rows(second.text, "history")) == 25
    oldest = web.get(re.search(r'href="([^"]+)" rel="last"', first.text).group(1).replace("&amp;", "&"))  # type: ignore[union-attr]
    assert "Page 3 of 3" in texts(oldest.text) and len(rows(oldest.text, "history")) == 10
    assert 'rel="next"' not in oldest.text and 'rel="prev"' in oldest.text
    ids = sql(cstack, "SELECT id FROM usage WHERE key_id = ? ORDER BY id LIMIT 10", info.id)
    assert all(f'/console/calls/{i}"' in oldest.text for (i,) in ids)
    export = web.get(f"/console/groups/{group}/calls.csv?limit=25")
    assert export.status == 200 and "attachment" in export.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(export.text)))
    assert len(table) == 60 and table[-1]["credits"] == "0.000001" and table[0]["credits"] == "0.000001059"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", table[0]["time"])  # ISO 8601, UTC
    page = web.get(f"/console/groups/{group}/calls")
    assert 'title="0.000001059 credits">0.00000106<' in page.text  # fixed decimals, the exact one on hover


def test_a_call_page_and_finding_a_call(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    gid = cstack.run(cstack.store.get_group(busy["group"])).id  # type: ignore[union-attr]
    (rid, request_id) = sql(
        cstack,
        "SELECT id, request_id FROM usage WHERE group_id = ? AND status = 'rejected' "
        "AND error_code = 'model_not_found'",
        gid,
    )[0]
    page = web.get(f"/console/calls/{rid}")
    for text in ("rejected", "model_not_found", request_id, "nobody/nothing", busy["group"]):
        assert text in page.text, text
    found = web.get(f"/console/calls?request={request_id}")
    assert found.status == 303 and found.headers["location"] == f"/console/calls/{rid}"
    assert "No call has the request id" in web.get("/console/calls?request=req_nothing").text
    assert web.get("/console/calls/99999999").status == 404 and web.get("/console/calls/x").status == 404


def test_every_groups_calls_with_the_same_filters_and_a_search_by_the_providers_id(
    cstack: Stack, web: Client, busy: dict[str, Any]
) -> None:
    other = cstack.group(10)
    cstack.client(cstack.key(group=other)).chat.completions.create(model=MODEL, messages=HI)

    def count(where: str = "1 = 1", *args: Any) -> int:
        return int(
            sql(
                cstack,
                f"SELECT count(*) FROM usage WHERE ts >= ? AND {where}",
                time.time() - 7 * 86400,
                *args,
            )[0][0]
        )

    for query, where, args in [
        ("", "1 = 1", ()),
        ("status=rejected", "status = ?", ("rejected",)),
        ("source=job", "source = ?", ("job",)),
        ("model=claude", "model LIKE ?", ("anthropic/claude%",)),
    ]:
        page = web.get(f"/console/calls?{query}")
        n = count(where, *args)
        assert page.status == 200 and n > 0 and f"({n:,} calls)" in texts(page.text), query
        assert len(rows(page.text, "history")) == min(n, 50), query
    every = web.get("/console/calls?limit=500").text
    assert f">{busy['group']}</a>" in every and f">{other}</a>" in every  # the group of each call
    export = web.get("/console/calls.csv?status=rejected")
    assert len(list(csv.DictReader(io.StringIO(export.text)))) == count("status = ?", "rejected")
    # the provider's request id finds the call as ours does
    (rid, upstream) = sql(
        cstack,
        "SELECT id, upstream_request_id FROM usage WHERE upstream_request_id IS NOT NULL "
        "ORDER BY id DESC LIMIT 1",
    )[0]
    found = web.get(f"/console/calls?request={upstream}")
    assert found.status == 303 and found.headers["location"] == f"/console/calls/{rid}"


def test_links_keep_the_toggle_and_the_period(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    """From the overview to a group, its tabs, a key and back: the Jobs/API choice and the period
    stay in every link; the overview's models and its "and N more" open filtered lists."""
    kept = "source=api&period=30d"
    overview = web.get(f"/console/?{kept}").text.replace("&amp;", "&")
    assert f"/console/groups/{busy['group']}?{kept}" in overview
    assert f"/console/calls?{kept}&model=" in overview
    assert f"/console/keys/{busy['keys'][0].id}?{kept}" in overview
    group = web.get(f"/console/groups/{busy['group']}?{kept}").text.replace("&amp;", "&")
    for tab in ("", "/keys", "/calls"):
        assert f'href="/console/groups/{busy["group"]}{tab}?{kept}"' in group, tab
    assert f"/console/keys/{busy['keys'][0].id}?{kept}" in group  # "By key"
    keys = web.get(f"/console/groups/{busy['group']}/keys?{kept}").text.replace("&amp;", "&")
    assert f"/console/keys/{busy['keys'][0].id}?{kept}" in keys
    key = web.get(f"/console/keys/{busy['keys'][0].id}?{kept}").text.replace("&amp;", "&")
    assert (
        "Last 30 days" in key
        and f"calls?{kept}&model=" in key
        and f'calls?{kept}&key={busy["keys"][0].id}"' in key
    )
    assert "Last 7 days" in web.get(f"/console/keys/{busy['keys'][0].id}").text  # the default of every page


def test_a_call_page_explains_its_charge(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    gid = cstack.run(cstack.store.get_group(busy["group"])).id  # type: ignore[union-attr]
    (rid, credits, prompt, completion, model) = sql(
        cstack,
        "SELECT id, credits, prompt_tokens, completion_tokens, model FROM usage WHERE group_id = ? "
        "AND status = 'ok' AND source = 'api' ORDER BY id LIMIT 1",
        gid,
    )[0]
    prices = console_of(cstack).gateway.catalog.models[model].prices
    assert credits == -(-(prompt * prices.input + completion * prices.output) // 1_000_000) > 0
    page = texts(web.get(f"/console/calls/{rid}").text)
    assert "How the charge was computed" in page and "(the same)" in page
    for text in (
        f"{prompt:,}",
        f"{completion:,}",
        to_credits(prices.input),
        to_credits(prices.output),
        to_credits(credits),
    ):
        assert text in page, text
    (refused,) = sql(cstack, "SELECT id FROM usage WHERE group_id = ? AND status = 'rejected' LIMIT 1", gid)[
        0
    ]
    assert "Refused before its reservation" in texts(web.get(f"/console/calls/{refused}").text)


def test_overview_and_group_figures_are_the_records_sums(
    cstack: Stack, web: Client, busy: dict[str, Any]
) -> None:
    gid = cstack.run(cstack.store.get_group(busy["group"])).id  # type: ignore[union-attr]
    calls, credits, failed = sql(
        cstack,
        "SELECT count(*), sum(credits), sum(CASE WHEN status = 'ok' THEN 0 ELSE 1 END) FROM usage WHERE group_id = ?",
        gid,
    )[0]
    page = web.get(f"/console/groups/{busy['group']}?period=24h")
    figures = texts(page.text.split('class="kpis"')[1].split("</section>")[0])
    assert f"Calls {calls}" in figures and f"{failed - 2} failed · 2 rejected" in figures
    assert f'title="{credits / 10**9:.9f}'.rstrip("0") in page.text or str(credits) in page.text
    assert (
        "By model" in page.text
        and "By key" in page.text
        and "By endpoint" in page.text
        and "By source" in page.text
    )
    overview = web.get("/console/?period=24h")
    total = sql(cstack, "SELECT count(*) FROM usage")[0][0]
    assert (
        f"Calls {total:,}" in texts(overview.text)
        and "Top groups" in overview.text
        and "Latency p50" in overview.text
    )
    jobs_only = web.get("/console/?period=24h&source=job")
    jobs = sql(cstack, "SELECT count(*) FROM usage WHERE source = 'job'")[0][0]
    assert f"Calls {jobs:,}" in texts(jobs_only.text)


def test_keys_page_search_and_status(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    keys = busy["keys"]
    page = web.get("/console/keys?q=" + busy["group"])
    assert len(rows(page.text, "all-keys")) == 2 and "never" in page.text  # no expiry
    assert "q=" in page.text
    web.post(f"/console/keys/{keys[1].id}/revoke", {"confirm": "yes"})
    live = web.get(f"/console/keys?q={busy['group']}&status=live")
    assert len(rows(live.text, "all-keys")) == 1 and f">{keys[0].id} · one<" in live.text
    revoked = web.get(f"/console/keys?q={busy['group']}&status=revoked&period=all")
    (row,) = rows(revoked.text, "all-keys")
    jobs = sql(cstack, "SELECT count(*) FROM usage WHERE key_id = ?", keys[1].id)[0][0]
    assert "revoked" in row and f'<td class="num">{jobs}</td>' in row
    key_page = web.get(f"/console/keys/{keys[0].id}")
    assert "Usage by model" in key_page.text and "Last used" in key_page.text


def test_batches_pages(cstack: Stack, web: Client) -> None:
    group = cstack.group(100)
    client = cstack.client(cstack.key(group=group))
    done = submit(client, [request("a", MODEL, "hi"), request("b", MODEL, "hi [fault:500]")])
    done = wait(client, done.id)
    refused = submit(client, [request("x", MODEL, "hi"), {"custom_id": "y"}])
    refused = wait(client, refused.id)
    assert (done.status, refused.status) == ("completed", "failed")
    listing = web.get(f"/console/batches?group={group}")
    assert (
        len(rows(listing.text, "batches")) == 2 and "2 of 2" in listing.text and "1 problem" in listing.text
    )
    page = web.get(f"/console/batches/{done.id}")
    assert "1 completed · 1 failed" in page.text and 'id="failed-lines"' in page.text
    failed_line = page.text.split('id="failed-lines"')[1]
    assert (
        "<code>b</code>" in failed_line
        and "<code>upstream_error</code>" in failed_line
        and "HTTP 500" in failed_line
    )
    spent = sql(cstack, "SELECT sum(credits) FROM usage WHERE batch_id = ?", done.id)[0][0]
    assert spent > 0 and f"calls?batch={done.id}" in page.text
    failed = web.get(f"/console/batches/{refused.id}")
    assert "It failed validation" in failed.text and "line" in texts(failed.text)
    assert "can no longer be cancelled" in web.get(f"/console/batches/{done.id}/cancel").text
    assert web.get("/console/batches/batch_nothing").status == 404


def test_times_in_a_zone_of_the_admins_choice(cstack: Stack, web: Client, busy: dict[str, Any]) -> None:
    gid = cstack.run(cstack.store.get_group(busy["group"])).id  # type: ignore[union-attr]
    (ts,) = sql(cstack, "SELECT max(ts) FROM usage WHERE group_id = ?", gid)[0]
    utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))
    assert utc in web.get(f"/console/groups/{busy['group']}/calls").text
    chosen = web.post("/console/display", {"zone": "Asia/Kolkata", "back": "/console/keys"})
    assert chosen.status == 303 and chosen.headers["location"] == "/console/keys"
    india = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts + 5.5 * 3600))
    page = web.get(f"/console/groups/{busy['group']}/calls?period=24h")
    assert india in page.text and utc not in page.text and "Asia/Kolkata" in page.text
    assert ":30</text>" in page.text  # hourly buckets start at :30 on India's clock
    assert web.post("/console/display", {"zone": "Mars/Base", "back": "/console/"}).status == 400
    assert web.post("/console/display", {"zone": "local", "browser": "", "back": "/console/"}).status == 400
    assert (
        web.post("/console/display", {"zone": "UTC", "back": "https://evil.example/"}).headers["location"]
        == "/console/"
    )


def test_embeddings_calls_in_the_console_csv_and_metrics(cstack: Stack, web: Client) -> None:
    group = cstack.group(100)
    client = cstack.client(cstack.key(group=group))
    client.embeddings.create(model="openai/text-embedding-3-small", input=["console", "rows"])
    client.chat.completions.create(model=MODEL, messages=HI)
    page = web.get(f"/console/groups/{group}/calls?endpoint=embeddings")
    assert "(1 calls)" in texts(page.text) or "(1 call)" in texts(page.text)
    assert "openai/text-embedding-3-small" in page.text
    overview = web.get(f"/console/groups/{group}")
    assert "embeddings" in texts(overview.text)  # the breakdown by endpoint
    table = list(
        csv.DictReader(io.StringIO(web.get(f"/console/groups/{group}/calls.csv?endpoint=embeddings").text))
    )
    assert [(r["endpoint"], r["model"]) for r in table] == [("embeddings", "openai/text-embedding-3-small")]
    metrics = web.get("/metrics").text
    assert 'router_requests_total{endpoint="/v1/embeddings",status="200"}' in metrics
