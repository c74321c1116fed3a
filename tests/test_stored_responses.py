"""Stored responses for every group, through the OpenAI Python SDK on a real gateway, on SQLite
and on PostgreSQL: retrieve, delete, input items, previous_response_id across providers, item_reference,
isolation between groups, what is not stored, and a store write that fails after the provider answered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.config import ReliabilitySettings, ResponsesSettings, Settings, StoreSettings
from tests.conftest import ONE_PER_PROVIDER, Postgres, Stack, pg_admin

MODELS = ONE_PER_PROVIDER


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway on each kind of store (module-wide: one start per kind)."""
    tmp = tmp_path_factory.mktemp(f"stored-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp}/router.db"
    else:
        postgres: Postgres = request.getfixturevalue("pg")
        url = postgres.fresh_url()
    settings = Settings(
        store=StoreSettings(url=url), reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9)
    )
    stack = Stack(tmp, settings).start()
    yield stack
    stack.close_clients()
    stack.stop()


@pytest.fixture(autouse=True)
def _close_stored_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "stored" in request.fixturenames:
        request.getfixturevalue("stored").close_clients()


def _rows(stack: Stack, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return stack.run(stack.gateway.store.database.select(sql, args))


def _write(stack: Stack, sql: str) -> None:
    db = stack.gateway.store.database
    if db.dialect == "sqlite":
        stack.run(db.write(sql))
    else:
        stack.run(
            pg_admin(stack.settings.store.url.replace("?search_path=", "?options=-csearch_path%3D"), sql)
        )


@pytest.mark.parametrize("model", MODELS)
def test_create_retrieve_list_delete(stored: Stack, model: str) -> None:
    client = stored.client()
    first = client.responses.create(model=model, input="Remember the number 7.", instructions="Be brief.")
    assert first.store is True and first.status == "completed"
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text and again.model == model
    assert again.instructions == "Be brief." and again.usage is not None
    assert again.usage.input_tokens == first.usage.input_tokens  # type: ignore[union-attr]
    items = client.responses.input_items.list(first.id)
    [item] = items.data
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")  # type: ignore[union-attr]
    assert item.content[0].text == "Remember the number 7."  # type: ignore[union-attr]
    assert items.first_id == items.last_id == item.id and items.has_more is False
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(first.id)
    assert info.value.code == "response_not_found"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as bad:  # its items went with it
        client.responses.create(model=model, input=[{"type": "item_reference", "id": first.output[-1].id}])
    assert bad.value.code == "item_not_found"  # type: ignore[attr-defined]


def test_previous_response_id_moves_a_conversation_between_providers(stored: Stack) -> None:
    client = stored.client()
    first = client.responses.create(model="anthropic/claude-haiku-4-5", input="My name is Ada. Remember it.")
    second = client.responses.create(
        model="google/gemini-2.5-flash", input="What is my name?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id and second.model == "google/gemini-2.5-flash"
    sent = stored.emulator("google").requests[-1]
    texts = str(sent)
    assert "My name is Ada" in texts and first.output_text[:20] in texts and "What is my name?" in texts
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens  # type: ignore[union-attr]
    third = client.responses.create(
        model="openai/gpt-4o-mini", input="And again?", previous_response_id=second.id
    )
    native = stored.emulator("openai").requests[-1]
    assert native["store"] is False and "previous_response_id" not in native
    assert [i.get("role") for i in native["input"] if isinstance(i, dict)][:4] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert all("id" not in i for i in native["input"])
    assert third.previous_response_id == second.id and third.store is True
    assert client.responses.retrieve(third.id).previous_response_id == second.id
    # the chain's input items are the response's own, not its history
    assert [i.content[0].text for i in client.responses.input_items.list(third.id).data] == ["And again?"]  # type: ignore[union-attr]


def test_stream_is_stored_before_its_terminal_event(stored: Stack) -> None:
    client = stored.client()
    for model in ("mistral/mistral-small-latest", "openai/gpt-4o-mini"):
        with client.responses.stream(model=model, input="Say something.") as stream:
            created = None
            for event in stream:
                if event.type == "response.created":
                    created = event.response.id
            final = stream.get_final_response()
        assert final.id == created
        assert client.responses.retrieve(final.id).output_text == final.output_text


def test_item_reference_resolves_from_the_group_store(stored: Stack) -> None:
    client = stored.client()
    for model in ("upstage/solar-mini", "openai/gpt-4o-mini"):
        first = client.responses.create(model=model, input="Remember 42.")
        ref = first.output[-1].id
        second = client.responses.create(
            model=model,
            input=[
                {"role": "user", "content": "Remember 42."},
                {"type": "item_reference", "id": ref},
                {"role": "user", "content": "Which number?"},
            ],
        )
        assert second.output_text
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(
                model=model,
                input=[{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_nowhere"}],
            )
        assert info.value.param == "input[1]" and info.value.code == "item_not_found"  # type: ignore[attr-defined]
        assert "input[1]" in info.value.message
        listed = client.responses.input_items.list(second.id, order="asc").data
        assert listed[1].id == ref and listed[1].role == "assistant"  # type: ignore[union-attr]


def test_another_group_sees_nothing(stored: Stack) -> None:
    mine, theirs = stored.client(), stored.client()
    response = mine.responses.create(model="google/gemini-2.5-flash", input="private")
    for call in (
        lambda: theirs.responses.retrieve(response.id),
        lambda: theirs.responses.delete(response.id),
        lambda: theirs.responses.input_items.list(response.id),
        lambda: theirs.responses.cancel(response.id),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert info.value.code == "response_not_found"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError) as info:
        theirs.responses.create(
            model="google/gemini-2.5-flash", input="go on", previous_response_id=response.id
        )
    assert info.value.param == "previous_response_id"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as bad:
        theirs.responses.create(
            model="google/gemini-2.5-flash", input=[{"type": "item_reference", "id": response.output[0].id}]
        )
    assert bad.value.param == "input[0]"
    assert mine.responses.retrieve(response.id).output_text == response.output_text


def test_what_is_not_stored(stored: Stack) -> None:
    group = stored.group(credits=0.000001)
    client = stored.client(stored.key(group=group))
    unstored = stored.client().responses.create(model="anthropic/claude-haiku-4-5", input="hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        stored.client().responses.retrieve(unstored.id)
    with pytest.raises(openai.APIStatusError) as info:  # refused before the provider answered: 402
        client.responses.create(model="anthropic/claude-haiku-4-5", input="hi")
    assert info.value.status_code == 402
    [gid] = _rows(stored, "SELECT id FROM groups WHERE name = ?", group)[0]
    assert _rows(stored, "SELECT COUNT(*) FROM responses WHERE group_id = ?", gid) == [(0,)]


def test_bad_ids_and_limits(stored: Stack) -> None:
    client = stored.client()
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="openai/gpt-4o-mini", input="x", previous_response_id="resp_unknown")
    assert info.value.code == "response_not_found" and info.value.param == "previous_response_id"  # type: ignore[attr-defined]
    for call in (
        lambda: client.responses.retrieve("resp_" + "x" * 400),
        lambda: client.responses.retrieve("nope"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    # a chain grown past the model's context window: 400 naming the window
    words = "hello " * 20_000
    first = client.responses.create(model="upstage/solar-mini-250422", input=words, max_output_tokens=16)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="upstage/solar-mini-250422", input=words, previous_response_id=first.id)
    assert bad.value.code == "context_length_exceeded" and "32768" in bad.value.message  # type: ignore[attr-defined]
    assert bad.value.param == "previous_response_id"  # type: ignore[attr-defined]


def test_input_items_paginate_as_openai(stored: Stack) -> None:
    client = stored.client()
    given = [{"role": "user", "content": f"line {n}"} for n in range(5)]
    response = client.responses.create(model="mistral/mistral-small-latest", input=given)  # type: ignore[arg-type]
    everything = client.responses.input_items.list(response.id, order="asc", limit=100).data
    assert [i.content[0].text for i in everything] == [f"line {n}" for n in range(5)]  # type: ignore[union-attr]
    ids = [i.id for i in everything]
    page = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.id for i in page.data] == ids[:2] and page.has_more and page.last_id == ids[1]
    page = client.responses.input_items.list(response.id, order="asc", limit=2, after=ids[1])
    assert [i.id for i in page.data] == ids[2:4] and page.has_more
    page = client.responses.input_items.list(response.id, limit=10)  # newest first by default
    assert [i.id for i in page.data] == ids[::-1] and not page.has_more
    page = client.responses.input_items.list(
        response.id, order="asc", limit=2, extra_query={"before": ids[3]}
    )
    assert [i.id for i in page.data] == ids[1:3] and page.has_more
    assert [i.id for i in client.responses.input_items.list(response.id, order="asc")] == ids  # auto-paging
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.input_items.list(response.id, limit=1000)
    assert info.value.param == "limit"  # type: ignore[attr-defined]


def test_a_failed_store_write_still_settles_and_answers_unstored(stored: Stack) -> None:
    group = stored.group()
    client = stored.client(stored.key(group=group))
    db = stored.gateway.store.database
    if db.dialect == "sqlite":
        _write(
            stored,
            "CREATE TRIGGER refuse_responses BEFORE INSERT ON responses "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )
        undo = "DROP TRIGGER refuse_responses"
    else:
        _write(
            stored,
            "CREATE FUNCTION refuse_responses() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql; "
            "CREATE TRIGGER refuse_responses BEFORE INSERT ON responses "
            "FOR EACH ROW EXECUTE FUNCTION refuse_responses()",
        )
        undo = "DROP TRIGGER refuse_responses ON responses; DROP FUNCTION refuse_responses()"
    try:
        answer = client.responses.create(model="anthropic/claude-haiku-4-5", input="hi")
        with client.responses.stream(model="openai/gpt-4o-mini", input="hi") as stream:
            streamed = stream.get_final_response()
    finally:
        _write(stored, undo)
    assert answer.output_text and answer.store is False and streamed.store is False
    for response_id in (answer.id, streamed.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
    records = stored.run(stored.store.usage(group=group, limit=10))
    assert sorted((r.status, r.credits > 0) for r in records) == [("ok", True), ("ok", True)]
    g = stored.run(stored.store.get_group(group))
    assert g.reserved == 0 and g.spent == sum(r.credits for r in records)


def test_retention_purges_expired_responses(stored: Stack) -> None:
    client = stored.client()
    response = client.responses.create(model="openai/gpt-4o-mini", input="short-lived")
    responses = stored.gateway.responses
    assert stored.run(responses.purge(time.time())) == 0 or True  # others' responses are not expired yet
    purged = stored.run(responses.purge(time.time() + 31 * 86400))  # a month later
    assert purged >= 1
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    assert _rows(stored, "SELECT COUNT(*) FROM response_items WHERE response_id = ?", response.id) == [(0,)]


def test_size_limit_is_a_clear_400(tmp_path: Path) -> None:
    settings = Settings(store=StoreSettings(url=f"sqlite:///{tmp_path}/r.db"))
    settings.responses.max_stored_bytes = 2048
    stack = Stack(tmp_path, settings).start()
    try:
        client = stack.client()
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="openai/gpt-4o-mini", input="x" * 4096)
        assert info.value.param == "store" and "2048" in info.value.message  # type: ignore[attr-defined]
        assert (
            client.responses.create(model="openai/gpt-4o-mini", input="x" * 4096, store=False).store is False
        )
    finally:
        stack.close_clients()
        stack.stop()


def _poll(client: openai.OpenAI, response_id: str, until: tuple[str, ...], seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in until or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


@pytest.mark.parametrize(
    "model", ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "google/gemini-2.5-flash"]
)
def test_background_is_polled_and_billed_as_a_foreground_call(stored: Stack, model: str) -> None:
    group = stored.group()
    client = stored.client(stored.key(group=group))
    queued = client.responses.create(model=model, input="Tell me about the weather.", background=True)
    assert queued.status in ("queued", "in_progress") and queued.background is True and not queued.output
    done = _poll(client, queued.id, ("completed", "failed"))
    assert (
        done.status == "completed" and done.output_text and done.id == queued.id and done.background is True
    )
    assert done.usage is not None and done.model == model
    foreground = client.responses.create(model=model, input="Tell me about the weather.")
    assert foreground.output_text == done.output_text
    records = stored.run(stored.store.usage(group=group, limit=10))
    assert [(r.source, r.endpoint, r.status) for r in records] == [("api", "responses", "ok")] * 2
    assert records[0].credits == records[1].credits > 0  # billed exactly like the foreground call
    assert stored.run(stored.store.get_group(group)).reserved == 0
    assert [i.content[0].text for i in client.responses.input_items.list(queued.id)] == [  # type: ignore[union-attr]
        "Tell me about the weather."
    ]


def test_background_continues_a_stored_conversation(stored: Stack) -> None:
    client = stored.client()
    first = client.responses.create(model="anthropic/claude-haiku-4-5", input="My name is Ada.")
    queued = client.responses.create(
        model="google/gemini-2.5-flash",
        input="What is my name?",
        previous_response_id=first.id,
        background=True,
    )
    done = _poll(client, queued.id, ("completed", "failed"))
    assert done.status == "completed" and done.previous_response_id == first.id
    assert "My name is Ada." in str(stored.emulator("google").requests[-1])


def test_background_cancel(stored: Stack) -> None:
    group = stored.group()
    client = stored.client(stored.key(group=group))
    marker = f"wait {group} [slow:4000]"
    queued = client.responses.create(model="mistral/mistral-small-latest", input=marker, background=True)
    assert _poll(client, queued.id, ("in_progress",)).status == "in_progress"
    deadline = time.monotonic() + 5  # its call is upstream (reserved): cancelling it now must settle it
    while marker not in str(stored.emulator("mistral").requests) and time.monotonic() < deadline:
        time.sleep(0.02)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.id == queued.id
    assert client.responses.cancel(queued.id).status == "cancelled"  # again: the same answer
    deadline = time.monotonic() + 5
    while not stored.run(stored.store.usage(group=group, limit=10)) and time.monotonic() < deadline:
        time.sleep(0.05)
    [record] = stored.run(stored.store.usage(group=group, limit=10))
    assert record.status == "interrupted" and record.source == "api"  # its call was stopped, settled once
    assert stored.run(stored.store.get_group(group)).reserved == 0
    time.sleep(0.3)
    assert client.responses.retrieve(queued.id).status == "cancelled"
    ended = client.responses.create(model="mistral/mistral-small-latest", input="hi", background=True)
    _poll(client, ended.id, ("completed",))
    for response_id in (
        ended.id,
        client.responses.create(model="mistral/mistral-small-latest", input="hi").id,
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.cancel(response_id)
        assert info.value.code == "response_not_cancellable"  # type: ignore[attr-defined]


def test_background_bad_input_is_refused_at_once(stored: Stack) -> None:
    group = stored.group()
    client = stored.client(stored.key(group=group))
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="anthropic/no-such-model", input="hi", background=True)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="anthropic/claude-haiku-4-5",
            input="hi",
            background=True,
            tools=[{"type": "web_search"}],
            tool_choice={"type": "web_search"},
        )  # type: ignore[misc,arg-type]
    assert info.value.param == "tool_choice"  # type: ignore[attr-defined]
    [gid] = _rows(stored, "SELECT id FROM groups WHERE name = ?", group)[0]
    assert _rows(stored, "SELECT COUNT(*) FROM responses WHERE group_id = ?", gid) == [(0,)]


def test_background_survives_a_restart(tmp_path: Path) -> None:
    from core.config import JobsSettings

    url = f"sqlite:///{tmp_path}/router.db"
    idle = Settings(store=StoreSettings(url=url), jobs=JobsSettings(runner=False))
    first = Stack(tmp_path / "a", idle).start()
    try:
        key = first.key()
        client = first.client(key)
        waiting = client.responses.create(model="upstage/solar-mini", input="later", background=True)
        dead = client.responses.create(model="upstage/solar-mini", input="lost", background=True)
        time.sleep(0.3)
        assert client.responses.retrieve(waiting.id).status == "queued"
        # a process that died while running one: in_progress under a lease nobody renews
        first.run(
            first.gateway.store.database.write(
                "UPDATE responses SET status = 'in_progress', lease_owner = 'dead', lease_expires = 0 WHERE id = ?",
                (dead.id,),
            )
        )
    finally:
        first.close_clients()
        first.stop()
    second = Stack(tmp_path / "b", Settings(store=StoreSettings(url=url))).start()
    try:
        client = second.client(key)
        done = _poll(client, waiting.id, ("completed", "failed"))
        assert done.status == "completed" and done.output_text
        lost = client.responses.retrieve(dead.id)
        assert lost.status == "failed" and lost.error is not None and "not run again" in lost.error.message
    finally:
        second.close_clients()
        second.stop()


@pytest.mark.parametrize("model", MODELS)
def test_parse_is_stored_and_continued(stored: Stack, model: str) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        temperature_c: int

    client = stored.client()
    parsed = client.responses.parse(model=model, input="The weather in Seoul", text_format=Weather)
    assert isinstance(parsed.output_parsed, Weather)
    again = client.responses.retrieve(parsed.id)
    assert Weather.model_validate_json(again.output_text) == parsed.output_parsed
    assert (
        again.text is not None and again.text.format is not None and again.text.format.type == "json_schema"
    )
    follow = client.responses.create(model=model, input="Is that warm?", previous_response_id=parsed.id)
    assert follow.output_text and follow.previous_response_id == parsed.id


def test_one_groups_queued_responses_do_not_hold_another_groups(store_url: str, tmp_path: Path) -> None:
    """Two runner places; group A queues twelve slow background responses, then group B one. B's runs
    at the next free place (the group running the fewest first), not after A's twelve; all of A's run."""
    settings = Settings(
        store=StoreSettings(url=store_url),
        responses=ResponsesSettings(background_concurrency=2),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        heavy, light = stack.client(), stack.client()
        model = "openai/gpt-4o-mini"
        mine = [
            heavy.responses.create(model=model, input=f"a{n} [slow:250]", background=True) for n in range(12)
        ]
        theirs = light.responses.create(model=model, input="b [slow:250]", background=True)
        done = _poll(light, theirs.id, ("completed", "failed"))
        assert done.status == "completed"
        ahead = sum(heavy.responses.retrieve(r.id).status == "completed" for r in mine)
        assert ahead <= 4, f"group B's response waited behind {ahead} of group A's"
        ended = [_poll(heavy, r.id, ("completed", "failed"), seconds=30) for r in mine]
        assert [r.status for r in ended] == ["completed"] * 12
    finally:
        stack.close_clients()
        stack.stop()
