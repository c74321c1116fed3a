"""Jobs: the OpenAI Batch API (``/v1/files``, ``/v1/batches``) through the gateway, with the official
OpenAI SDK as the client; the jobs store on SQLite and PostgreSQL; a gateway killed mid-job.

The PostgreSQL tests need a server (``postgresql://postgres@127.0.0.1:5432/postgres``, or the URL in
``$ROUTER_TEST_POSTGRES``); they fail, never skip, without one. The session creates a database
``router_jobs_<random>`` (one schema per test) and drops it at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal
from typing import Final as Const

import openai
import pytest
from aiohttp import web

from billing.backends import open_store
from billing.store import Store
from core.config import JobsSettings, ReliabilitySettings, Settings, StoreSettings
from emulators.common import serve as serve_emulator
from emulators.registry import FACTORIES
from jobs.backends import open_job_store
from jobs.store import BatchRow, FileRow, Final, GroupLoad, JobStore, Line, Outcome, Tokens
from tests.conftest import Postgres, Stack, free_port, run_sync
from tests.test_crash import _cli, _serve

CHAT: Const[Literal["/v1/chat/completions"]] = "/v1/chat/completions"
MIXED = [
    "openai/gpt-4o-mini",
    "anthropic/claude-haiku-4-5",
    "google/gemini-2.5-flash",
    "upstage/solar-mini",
    "mistral/mistral-small-latest",
]
TERMINAL = ("completed", "failed", "expired", "cancelled")


def request(custom_id: str, model: str, prompt: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    if url == CHAT:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], **body}
    else:
        body = {"model": model, "input": prompt, **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(items: list[Any]) -> bytes:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items).encode()


def submit(client: openai.OpenAI, items: list[Any], endpoint: str = CHAT, **kw: Any) -> Any:
    upload = client.files.create(file=("batch.jsonl", jsonl(items)), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h", **kw)  # type: ignore[arg-type]


def wait(client: openai.OpenAI, batch_id: str, until: Any = TERMINAL, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        batch = client.batches.retrieve(batch_id)
        if (batch.status in until) if isinstance(until, tuple) else until(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}: {batch.request_counts}"
        time.sleep(0.05)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("jobs")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        jobs=JobsSettings(
            poll_interval=0.05, concurrency=4, stop_grace=1.0, lease_seconds=3.0, max_file_bytes=64 * 1024
        ),
    )
    stack = Stack(tmp, settings).start()
    try:
        yield stack
    finally:
        stack.close_clients()
        stack.stop()


# -- the Batch API through the SDK -----------------------------------------------------------------------
def test_mixed_provider_batch_completes_and_is_billed_as_jobs(jobs: Stack) -> None:
    group = jobs.group(100)
    client = jobs.client(jobs.key(group=group))
    items = [
        request(f"req-{n}-{model}", model, f"hello {n}", max_tokens=50) for n in range(2) for model in MIXED
    ]
    created = submit(client, items, metadata={"run": "mixed"})
    assert created.status == "validating" and created.metadata == {"run": "mixed"}
    assert created.expires_at == created.created_at + 24 * 3600
    batch = wait(client, created.id)
    assert batch.status == "completed", batch.errors
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 10, "failed": 0}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    assert batch.usage is not None and batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    out = lines_of(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(item["custom_id"] for item in items)
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        assert response["body"]["object"] == "chat.completion"
        assert line["custom_id"].endswith(response["body"]["model"])
        assert response["body"]["choices"][0]["message"]["content"]
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{batch.id}_output.jsonl"
    # every call is one usage record with source=job, none with source=api
    records = jobs.run(jobs.store.usage(group=group, source="job"))
    assert len(records) == 10 and all(r.status == "ok" and r.endpoint == "chat" for r in records)
    assert {r.request_id for r in records} == {line["response"]["request_id"] for line in out}
    assert jobs.run(jobs.store.usage(group=group, source="api")) == []
    spent = jobs.run(jobs.store.get_group(group))
    assert spent is not None and spent.spent == sum(r.credits for r in records) > 0 and spent.reserved == 0


def test_responses_batch(jobs: Stack) -> None:
    client = jobs.client()
    items = [request(f"r-{model}", model, "hello", url="/v1/responses") for model in MIXED[:2]]
    batch = wait(client, submit(client, items, endpoint="/v1/responses").id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    for line in lines_of(client, batch.output_file_id):
        assert line["response"]["status_code"] == 200 and line["response"]["body"]["object"] == "response"


def test_embeddings_batch(jobs: Stack) -> None:
    group = jobs.group(10)
    client = jobs.client(jobs.key(group=group))
    models = ["openai/text-embedding-3-small", "google/gemini-embedding-001", "mistral/mistral-embed"]
    items = [request(f"e-{model}", model, "embed me", url="/v1/embeddings") for model in models]
    bad = [request("e-bad", "mistral/mistral-embed", "", url="/v1/embeddings")]
    failed = wait(client, submit(client, bad, endpoint="/v1/embeddings").id)
    assert failed.status == "failed" and failed.errors is not None
    assert (failed.errors.data[0].code, failed.errors.data[0].param) == ("invalid_value", "body.input")
    batch = wait(client, submit(client, items, endpoint="/v1/embeddings").id)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    for line in lines_of(client, batch.output_file_id):
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["object"] == "list"
        assert isinstance(body["data"][0]["embedding"], list) and body["usage"]["prompt_tokens"] > 0
    records = jobs.run(jobs.store.usage(group=group, source="job"))
    assert (
        len(records) == 3
        and {r.endpoint for r in records} == {"embeddings"}
        and all(r.credits for r in records)
    )


def test_list_files_batches_and_isolation(jobs: Stack) -> None:
    client, other = jobs.client(), jobs.client()
    ids = [submit(client, [request("a", MIXED[0], "hi")]).id for _ in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in client.batches.list(limit=2, after=ids[1]).data] == [ids[0]]
    assert {f.purpose for f in client.files.list().data} <= {"batch", "batch_output"}
    file_id = client.batches.retrieve(ids[0]).input_file_id
    # another group's key sees none of it
    assert other.batches.list().data == [] and other.files.list().data == []
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(ids[0])
    with pytest.raises(openai.NotFoundError):
        other.files.content(file_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    for batch_id in ids:
        wait(client, batch_id)
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)


def test_cancel_a_running_batch(jobs: Stack) -> None:
    client = jobs.client()
    marker = secrets.token_hex(4)
    items = [request(f"c{n}", MIXED[n % 5], f"{marker}-{n} [slow:400]") for n in range(16)]
    batch = submit(client, items)
    wait(client, batch.id, lambda b: b.request_counts.completed >= 1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.completed_at is None
    counts = batch.request_counts
    assert counts.total == 16 and 1 <= counts.completed < 16 and counts.completed + counts.failed == 16
    errors = lines_of(client, batch.error_file_id)
    assert len(errors) == counts.failed and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert all(e["response"] is None for e in errors)
    assert len(lines_of(client, batch.output_file_id)) == counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(wait(client, submit(client, [request("x", MIXED[0], "hi")]).id).id)


def test_credit_exhaustion_fails_the_rest_with_402(jobs: Stack) -> None:
    group = jobs.group(0.0025)  # a few calls of ~0.0006 credits each
    client = jobs.client(jobs.key(group=group))
    items = [
        request(f"e{n}", "openai/gpt-4o-mini", f"long {n} [tokens:1000]", max_tokens=1000) for n in range(10)
    ]
    batch = wait(client, submit(client, items).id)
    assert batch.status == "completed"
    counts = batch.request_counts
    assert counts.completed >= 1 and counts.failed >= 1 and counts.completed + counts.failed == 10
    errors = lines_of(client, batch.error_file_id)
    assert len(errors) == counts.failed
    for line in errors:
        assert line["response"]["status_code"] == 402 and line["error"]["code"] == "insufficient_credits"
        assert line["response"]["body"]["error"]["type"] == "insufficient_credits"
    state = jobs.run(jobs.store.get_group(group))
    assert state is not None and state.balance >= 0 and state.reserved == 0
    assert state.spent <= int(0.0025 * 10**9)
    records = jobs.run(jobs.store.usage(group=group, source="job"))
    assert len([r for r in records if r.status == "ok"]) == counts.completed
    refused = [r for r in records if r.status == "rejected"]  # every line has its record, refused ones too
    assert len(refused) == counts.failed and {r.error_code for r in refused} == {"insufficient_credits"}
    assert {r.batch_id for r in records} == {batch.id} and sum(r.credits for r in refused) == 0


def test_revoked_key_stops_its_job_with_401s(jobs: Stack) -> None:
    group = jobs.group(100)
    client, watcher = jobs.client(jobs.key(group=group)), jobs.client(jobs.key(group=group))
    items = [request(f"v{n}", MIXED[n % 5], f"revoked {n} [slow:500]") for n in range(20)]
    batch = submit(client, items)
    wait(watcher, batch.id, lambda b: b.request_counts.completed >= 1)
    key_id = jobs.run(jobs.store.list_keys(group))[0].id
    assert jobs.run(jobs.store.revoke_key(key_id))
    done = wait(watcher, batch.id)  # the same group's other key still sees the batch
    counts = done.request_counts
    assert done.status == "completed" and counts.completed >= 1 and counts.failed >= 1
    for line in lines_of(watcher, done.error_file_id):
        assert line["response"]["status_code"] == 401 and line["error"]["code"] == "invalid_api_key"


def test_a_batch_past_its_window_expires(jobs: Stack) -> None:
    client = jobs.client()
    upload = client.files.create(file=("f.jsonl", jsonl([request("late", MIXED[0], "hi")])), purpose="batch")
    runner = jobs.gateway.jobs
    principal = jobs.run(runner.store.principal_by_id(jobs.run(jobs.store.list_keys())[-1].id))
    now = int(time.time())
    row = BatchRow(
        "batch_" + secrets.token_hex(12),
        principal.group_id,
        principal.key_id,
        CHAT,
        upload.id,
        "24h",
        "validating",
        now - 86400,
        now - 1,
    )
    jobs.run(runner.store.create_batch(row))
    runner.poke()
    batch = wait(client, row.id)
    assert batch.status == "expired" and batch.expired_at and batch.request_counts.failed == 1
    assert [line["error"]["code"] for line in lines_of(client, batch.error_file_id)] == ["batch_expired"]


BAD_LINES: list[tuple[str, list[Any], int, str]] = [
    ("malformed", [request("a", MIXED[0], "hi"), '{"custom_id": "b", "method": '], 2, "invalid_json_line"),
    ("no custom_id", [{"method": "POST", "url": CHAT, "body": {}}], 1, "missing_required_parameter"),
    ("duplicate", [request("same", MIXED[0], "a"), request("same", MIXED[1], "b")], 2, "duplicate_custom_id"),
    (
        "wrong url",
        [request("a", MIXED[0], "hi"), request("b", MIXED[0], "hi", url="/v1/responses")],
        2,
        "mismatched_url",
    ),
    ("unknown model", [request("a", "openai/no-such-model", "hi")], 1, "model_not_found"),
    (
        "no messages",
        [{"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": MIXED[0]}}],
        1,
        "missing_required_parameter",
    ),
    ("stream", [request("a", MIXED[0], "hi", stream=True)], 1, "invalid_value"),
    (
        "nested too deeply",
        [request("a", MIXED[0], "hi"), '{"custom_id": "b", "body": ' + "[" * 5000 + "]" * 5000 + "}"],
        2,
        "invalid_json_line",
    ),  # it crashed the validation (RecursionError): the batch never left validating
    (
        "nested deeply",
        [
            {
                "custom_id": "a",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "model": MIXED[0],
                    "messages": [{"role": "user", "content": "hi"}],
                    "metadata": json.loads("[" * 500 + "]" * 500),
                },
            }
        ],
        1,
        "invalid_json_line",
    ),
]


@pytest.mark.parametrize("items,line,code", [case[1:] for case in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_validation_fails_the_batch_with_line_numbers(
    jobs: Stack, items: list[Any], line: int, code: str
) -> None:
    client = jobs.client()
    batch = wait(client, submit(client, items).id)
    assert batch.status == "failed" and batch.failed_at and batch.in_progress_at is None
    assert batch.errors is not None and batch.errors.data
    first = batch.errors.data[0]
    assert (first.line, first.code) == (line, code) and first.message
    assert batch.request_counts.total == 0 and batch.output_file_id is None


def test_uploads_and_creates_that_are_refused(jobs: Stack) -> None:
    client = jobs.client()
    with pytest.raises(openai.APIStatusError) as too_large:
        client.files.create(file=("big.jsonl", b"x" * (64 * 1024 + 1)), purpose="batch")
    assert too_large.value.status_code == 413 and "max_file_bytes" in too_large.value.message
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("f.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.files.create(file=("f.jsonl", b"\n"), purpose="batch")
    upload = client.files.create(file=("f.jsonl", jsonl([request("a", MIXED[0], "hi")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=jobs.base_url, api_key="sk-mr-v1-" + "x" * 43, max_retries=0).batches.list()


# -- the jobs store, on SQLite and PostgreSQL -------------------------------------------------------------
@pytest.fixture
async def stores(store_url: str, tmp_path: Path) -> AsyncIterator[tuple[Store, JobStore]]:
    billing = open_store(store_url)
    await billing.open()
    job_store = open_job_store(billing, str(tmp_path / "files"))
    await job_store.open()
    try:
        yield billing, job_store
    finally:
        await billing.close()


def _batch(group_id: int, key_id: int, **kw: Any) -> BatchRow:
    now = int(time.time())
    fields: dict[str, Any] = {
        "id": f"batch_{secrets.token_hex(6)}",
        "group_id": group_id,
        "key_id": key_id,
        "endpoint": CHAT,
        "input_file_id": "file-x",
        "completion_window": "24h",
        "status": "validating",
        "created_at": now,
        "expires_at": now + 86400,
        **kw,
    }
    return BatchRow(**fields)


async def _team(billing: Store, name: str) -> tuple[int, int]:
    group = await billing.create_group(name, 10**9)
    key = await billing.create_key(name, "k", secrets.token_hex(16), "sk-mr-v1-...abcd")
    return group.id, key.id


async def test_store_files_and_principals(stores: tuple[Store, JobStore]) -> None:
    billing, store = stores
    (group, key), (other, _) = await _team(billing, "a"), await _team(billing, "b")
    rows = [FileRow(f"file-{n}", group, key, "batch", f"{n}.jsonl", 3, 100 + n) for n in range(3)]
    for n, row in enumerate(rows):
        await store.create_file(row, f"{n}\n\x00".encode())
    assert await store.get_file(group, "file-1") == rows[1] and await store.get_file(other, "file-1") is None
    assert (
        await store.file_content(group, "file-2") == b"2\n\x00"
        and await store.file_content(other, "file-2") is None
    )
    assert [f.id for f in await store.list_files(group, None, None, 2, False)] == ["file-2", "file-1"]
    assert [f.id for f in await store.list_files(group, "batch", "file-1", 5, False)] == ["file-0"]
    assert [f.id for f in await store.list_files(group, None, "file-0", 5, True)] == ["file-1", "file-2"]
    assert await store.list_files(group, "batch_output", None, 5, False) == []
    assert not await store.delete_file(other, "file-0") and await store.delete_file(group, "file-0")
    assert await store.file_content(group, "file-0") is None
    principal = await store.principal_by_id(key)
    assert principal is not None and (principal.key_id, principal.group_id, principal.group_name) == (
        key,
        group,
        "a",
    )
    await billing.revoke_key(key)
    assert await store.principal_by_id(key) is None  # a revoked key's job stops with errors


async def test_store_leases_one_runner_per_batch(stores: tuple[Store, JobStore]) -> None:
    billing, store = stores
    group, key = await _team(billing, "a")
    batch = _batch(group, key)
    await store.create_batch(batch)
    assert [b.id for b in await store.list_batches(group, None, 5)] == [batch.id]
    claimed = await store.claim_batch("A", 0.3, [])
    assert claimed is not None and claimed.id == batch.id and claimed.lease_owner == "A"
    assert await store.claim_batch("B", 0.3, []) is None  # held
    assert (
        await store.renew(batch.id, "B", 0.3) is None
        and await store.renew(batch.id, "A", 0.3) == "validating"
    )
    await asyncio.sleep(0.5)  # A went silent: its lease runs out
    taken = await store.claim_batch("B", 30, [])
    assert taken is not None and taken.lease_owner == "B"
    assert await store.renew(batch.id, "A", 30) is None  # A learns it lost the batch
    lines = [Line(n, f"c{n}", "{}") for n in range(1, 4)]
    assert not await store.start_batch(batch.id, "A", lines, 1)  # only the holder writes
    assert await store.start_batch(batch.id, "B", lines, 1)
    assert await store.claim_line(batch.id, "A", 1.0) is None
    await store.release(batch.id, "B")
    assert (await store.claim_batch("C", 30, [batch.id])) is None  # skipped: this runner already runs it
    assert await store.release_all() == 0 and (await store.claim_batch("C", 30, [])) is not None
    assert await store.release_all() == 1


async def test_store_lines_run_at_most_once(stores: tuple[Store, JobStore]) -> None:
    billing, store = stores
    group, key = await _team(billing, "a")
    batch = _batch(group, key)
    await store.create_batch(batch)
    assert await store.claim_batch("A", 30, []) is not None
    assert await store.start_batch(batch.id, "A", [Line(n, f"c{n}", f'{{"n":{n}}}') for n in range(1, 21)], 5)
    claims = await asyncio.gather(*(store.claim_line(batch.id, "A", 1.0) for _ in range(25)))
    got = [c.line_no for c in claims if c is not None]
    assert sorted(got) == list(range(1, 21))  # every line once, none twice, however many ask at once
    for n in range(1, 16):
        ok = Outcome(n % 2 == 0, f'{{"line":{n}}}', Tokens(input=2, output=3))
        assert await store.finish_line(batch.id, n, "A", ok, 2.0)
    assert not await store.finish_line(batch.id, 1, "A", Outcome(True, "again"), 3.0)  # finished once only
    assert not await store.finish_line(batch.id, 16, "Z", Outcome(True, "late"), 3.0)  # not its claim
    # the runner dies; the next lease holder fails what was in flight, never runs it again
    assert [line.line_no for line in await store.running_lines(batch.id)] == [16, 17, 18, 19, 20]
    for n in range(16, 21):
        assert await store.finish_line(batch.id, n, None, Outcome(False, f'{{"lost":{n}}}'), 4.0)
    assert await store.running_lines(batch.id) == []
    row = await store.get_batch(group, batch.id)
    assert row is not None and (row.total, row.completed, row.failed) == (20, 7, 13)
    assert (row.input_tokens, row.output_tokens) == (30, 45) and row.status == "in_progress"
    assert await store.set_finalizing(batch.id, "A", 9)
    states = await store.line_states(batch.id)
    assert [s.state for s in states].count("done") == 7
    out = FileRow("file-out", group, key, "batch_output", "o.jsonl", 2, 10)
    final = Final("completed", 10, 7, 13, out, b"o\n", None, b"")
    assert not await store.finalize(batch.id, "B", final)  # not the holder
    assert await store.finalize(batch.id, "A", final)
    done = await store.get_batch(None, batch.id)
    assert (
        done is not None
        and done.status == "completed"
        and done.completed_at == 10
        and done.lease_owner is None
    )
    assert done.output_file_id == "file-out" and done.error_file_id is None and done.finalizing_at == 9
    assert await store.file_content(group, "file-out") == b"o\n" and await store.line_states(batch.id) == []
    assert await store.claim_batch("A", 30, []) is None  # nothing open


async def test_store_cancel(stores: tuple[Store, JobStore]) -> None:
    billing, store = stores
    group, key = await _team(billing, "a")
    batch = _batch(group, key)
    await store.create_batch(batch)
    cancelled = await store.cancel_batch(group, batch.id, 7)
    assert cancelled is not None and cancelled.status == "cancelling" and cancelled.cancelling_at == 7
    assert await store.cancel_batch(group + 1, batch.id, 8) is None
    assert await store.claim_batch("A", 30, []) is not None
    assert await store.start_batch(batch.id, "A", [Line(1, "c1", "{}")], 8)
    assert (await store.get_batch(group, batch.id)).status == "cancelling"  # type: ignore[union-attr]
    assert await store.claim_line(batch.id, "A", 1.0) is None  # nothing more runs once cancelling


async def test_store_claims_the_least_served_group_first(stores: tuple[Store, JobStore]) -> None:
    billing, store = stores
    (a, a_key), (b, b_key) = await _team(billing, "a"), await _team(billing, "b")
    a_batches = [_batch(a, a_key) for _ in range(3)]
    for batch in a_batches:
        await store.create_batch(batch)
    late = _batch(b, b_key)
    await store.create_batch(late)  # the newest, of the group with nothing running
    assert await store.batch_load([]) == {a: GroupLoad(0, 3), b: GroupLoad(0, 1)}
    first = await store.claim_batch("R", 30, [])
    assert first is not None and first.id == a_batches[0].id  # equal: the oldest
    second = await store.claim_batch("R", 30, [])
    assert second is not None and second.id == late.id  # a runs one, b none: b's, though newer
    third = await store.claim_batch("R", 30, [])
    assert third is not None and third.id == a_batches[1].id
    assert await store.batch_load([]) == {a: GroupLoad(2, 1), b: GroupLoad(1, 0)}
    assert await store.batch_load([a_batches[2].id]) == {a: GroupLoad(2, 0), b: GroupLoad(1, 0)}
    await store.release(late.id, "R")
    assert await store.batch_load([]) == {a: GroupLoad(2, 1), b: GroupLoad(0, 1)}
    again = await store.claim_batch("R", 30, [])
    assert again is not None and again.id == late.id


def test_one_groups_batches_do_not_hold_another_groups_waiting(tmp_path: Path) -> None:
    """Two slots; group A's three batches take both, then group B submits one. B's runs as soon as one
    of A's lines in flight ends (A's batch lets its slot go between lines), not after A's batches end;
    every line of A's still runs exactly once and each batch completes."""
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        jobs=JobsSettings(poll_interval=0.05, concurrency=1, max_jobs=2, stop_grace=1.0, lease_seconds=3.0),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        heavy, light = stack.client(), stack.client()
        marker = secrets.token_hex(4)
        mine = [
            submit(heavy, [request(f"a{n}", MIXED[0], f"{marker}-{j}{n:02d} [slow:100]") for n in range(15)])
            for j in range(3)
        ]
        wait(heavy, mine[1].id, lambda b: b.status == "in_progress" and b.request_counts.completed >= 1)
        theirs = submit(light, [request(f"b{n}", MIXED[0], f"{marker}-9{n:02d}") for n in range(2)])
        done = wait(light, theirs.id, seconds=30)
        assert done.status == "completed" and done.request_counts.completed == 2
        behind = sum(heavy.batches.retrieve(b.id).request_counts.completed for b in mine)
        assert behind < 15, f"group B's batch waited for one of A's to end ({behind} of A's lines done first)"
        ended = [wait(heavy, b.id) for b in mine]
        assert [(b.status, b.request_counts.completed) for b in ended] == [("completed", 15)] * 3
        ran = Counter(re.findall(rf"{marker}-\d+", json.dumps(stack.emulator("openai").requests)))
        assert len(ran) == 47 and set(ran.values()) == {1}  # every line once: none cut short, none run twice
    finally:
        stack.close_clients()
        stack.stop()


# -- several replicas on one PostgreSQL -------------------------------------------------------------------
def test_replicas_run_a_job_once_and_take_over(pg: Postgres, tmp_path: Path) -> None:
    settings = Settings(
        store=StoreSettings(url=pg.fresh_url()),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        jobs=JobsSettings(poll_interval=0.05, concurrency=2, stop_grace=5.0, lease_seconds=2.0),
    )
    first: Stack | None = Stack(tmp_path / "a", settings).start()
    second: Stack | None = None
    try:
        assert first is not None
        client = first.client()
        marker = secrets.token_hex(4)
        items = [request(f"p{n}", "openai/gpt-4o-mini", f"{marker}-{n} [slow:150]") for n in range(12)]
        batch = submit(client, items)
        wait(client, batch.id, lambda b: b.request_counts.completed >= 2)
        second = Stack(tmp_path / "b", settings).start()  # a second replica: the job is the first's (lease)
        time.sleep(0.3)
        emulator = first.emulator("openai")
        first.close_clients()
        first.stop()  # the first replica goes away mid-job: its lines in flight finish, its lease is let go
        first = None
        ran_first = emulator.requests
        done = wait(second.client(client.api_key), batch.id)
        assert done.status == "completed" and done.request_counts.completed == 12
        one = Counter(re.findall(rf"{marker}-\d+", json.dumps(ran_first)))
        two = Counter(re.findall(rf"{marker}-\d+", json.dumps(second.emulator("openai").requests)))
        assert one and two and not set(one) & set(two)  # each replica ran its own lines, none ran one twice
        assert sorted((one + two).values()) == [1] * 12
    finally:
        for stack in (first, second):
            if stack is not None:
                stack.close_clients()
                stack.stop()


# -- a gateway process killed mid-job ---------------------------------------------------------------------
class Emulators:
    """The five emulated providers in a thread of their own, counting the requests they receive."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.running: list[tuple[str, str, str, web.AppRunner]] = []

    def start(self) -> Emulators:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        @web.middleware
        async def count(req: web.Request, handler: Any) -> web.StreamResponse:
            self.bodies.append(await req.read())
            return await handler(req)

        for prefix, (factory, root) in sorted(FACTORIES.items()):
            key = f"emu-{prefix}-key"
            emulator: Any = factory(key)
            emulator.app.middlewares.append(count)
            runner, port = await serve_emulator(emulator.app, "127.0.0.1", 0)
            self.running.append((prefix, f"http://127.0.0.1:{port}{root}", key, runner))

    def count(self, marker: str) -> Counter[str]:
        return Counter(
            m
            for body in list(self.bodies)
            for m in re.findall(rf"{marker}-\d+", body.decode("utf-8", "replace"))
        )

    def stop(self) -> None:
        async def _stop() -> None:
            for *_, runner in self.running:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


async def _job_usage(url: str) -> list[Any]:
    store = open_store(url)
    await store.open()
    try:
        return await store.usage(group="restart", source="job")
    finally:
        await store.close()


def test_killed_mid_job_resumes_and_runs_each_line_at_most_once(tmp_path: Path) -> None:
    emulators = Emulators().start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        config = tmp_path / "router.toml"
        providers = "".join(
            f'[providers.{prefix}]\nbase_url = "{url}"\napi_key = "{key}"\n'
            for prefix, url, key, _ in emulators.running
        )
        config.write_text(
            f'[store]\nurl = "sqlite:///{tmp_path}/router.db"\n[reliability]\nmax_retries = 0\n'
            f'[jobs]\npoll_interval = 0.05\nconcurrency = 2\n[observability]\nlog_format = "none"\n{providers}'
        )
        _cli(config, "groups", "create", "restart", "--credits", "100")
        key = _cli(config, "keys", "create", "--group", "restart").strip().splitlines()[-1]
        port = free_port()
        procs.append(_serve(config, port))
        marker = secrets.token_hex(4)
        items = [request(f"k{n}", MIXED[n % 5], f"{marker}-{n} [slow:500]") for n in range(10)]
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0) as client:
            batch = submit(client, items)
            before = wait(client, batch.id, lambda b: b.request_counts.completed >= 3, seconds=30)
        os.kill(procs[0].pid, signal.SIGKILL)  # lines in flight: claimed, sent, never finished
        procs[0].wait(10)
        port = free_port()
        procs.append(_serve(config, port))  # the restart resumes the job
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0) as client:
            done = wait(client, batch.id, seconds=60)
            out, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
        assert done.status == "completed"
        counts = done.request_counts
        assert counts.total == 10 and counts.completed + counts.failed == 10
        assert counts.completed > before.request_counts.completed  # lines ran after the restart
        assert sorted(line["custom_id"] for line in out + errors) == sorted(i["custom_id"] for i in items)
        sent = emulators.count(marker)
        assert all(n <= 1 for n in sent.values()), sent  # no line reached a provider twice
        for line in out:
            assert sent[f"{marker}-{line['custom_id'][1:]}"] == 1
        # a line in flight at the kill (at most `concurrency` = 2; none if it fell between two lines)
        # is failed, never run again
        assert len(errors) <= 2 and all(e["error"]["code"] == "interrupted" for e in errors)
        assert all("at most once" in e["error"]["message"] for e in errors)
        ok = [r for r in run_sync(_job_usage(f"sqlite:///{tmp_path}/router.db")) if r.status == "ok"]
        assert counts.completed <= len(ok) <= counts.completed + len(errors)  # billed once per call made
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        emulators.stop()


# -- a batch that cannot be validated or run -------------------------------------------------------------
def _run_failures(caplog: pytest.LogCaptureFixture, batch_id: str) -> int:
    return sum(1 for r in caplog.records if batch_id in r.getMessage() and "the run failed" in r.getMessage())


def test_a_line_nested_20000_deep_fails_the_batch_once(jobs: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """It raised RecursionError in validation: the lease was released and the batch re-claimed ~800
    times a second, stuck in validating. Now it fails once, with the line's error."""
    client = jobs.client(jobs.key())
    deep = (
        '{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
        '"openai/gpt-4o-mini", "messages": ' + "[" * 20_000 + "]" * 20_000 + "}}"
    )
    created = submit(client, [deep, request("ok", "openai/gpt-4o-mini", "hi")])
    batch = wait(client, created.id)
    assert batch.status == "failed"
    [error] = batch.errors.data
    assert error.code == "invalid_json_line" and error.line == 1 and "nested" in error.message
    time.sleep(0.3)
    assert _run_failures(caplog, created.id) == 0


def test_a_batch_whose_run_keeps_failing_backs_off(jobs: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """The store cannot read the input file (here: a directory where the file should be, which even
    root cannot read): each run fails. The runner backs off (1 s, 2 s, 4 s, ...) instead of re-claiming
    the batch at once, and runs it once the file is readable again."""
    client = jobs.client(jobs.key())
    content = jsonl([request("r1", "openai/gpt-4o-mini", "hi")])
    upload = client.files.create(file=("batch.jsonl", content), purpose="batch")
    path = jobs.tmp / "files" / upload.id
    path.unlink()
    path.mkdir()
    try:
        created = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
        time.sleep(2.5)
        failures = _run_failures(caplog, created.id)
        assert 1 <= failures <= 3, failures  # 0 s, 1 s, 3 s (it was hundreds a second)
        assert client.batches.retrieve(created.id).status == "validating"
    finally:
        path.rmdir()
        path.write_bytes(content)
    batch = wait(client, created.id, seconds=30)
    assert batch.status == "completed" and batch.request_counts.completed == 1
