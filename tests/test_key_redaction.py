"""A key of the gateway pasted into the wrong field (the model of a chat, Messages or Responses call,
``user``, ``safety_identifier``, ``metadata``, the ``x-request-id`` header, the path of GET /v1/models/...)
is never echoed in the answer, kept on the usage record or written to the access log: it is redacted
(``sk-mr-v1-…[redacted]``) where it enters, and never taken as the request id. Through the real
gateway, with a real key, its records read from the store and its access lines as they are written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from core.config import ReliabilitySettings, ServerSettings, Settings, StoreSettings
from core.redact import holds_key, redact_keys
from gateway.auth import generate_key
from tests.conftest import Lines, Stack, raw_request

HI: Any = [{"role": "user", "content": "hi"}]
MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway whose keys are ``acme-v1-...`` ([server] key_prefix)."""
    tmp = tmp_path_factory.mktemp("acme")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        server=ServerSettings(key_prefix="acme"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    s = Stack(tmp, settings).start()
    try:
        yield s
    finally:
        s.stop()


def post(stack: Stack, key: str, path: str, body: dict[str, Any], rid: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if rid is not None:
        headers["x-request-id"] = rid
    return raw_request(stack, "POST", path, json.dumps(body).encode(), headers)


def test_the_rule() -> None:
    key, redacted = generate_key("sk-mr"), "sk-mr-v1-…[redacted]"
    assert redact_keys(key, "sk-mr") == redacted
    assert redact_keys(f"openai/{key}", "sk-mr") == f"openai/{redacted}"
    assert (
        redact_keys(f"Bearer {key.upper()} and {key[:20]}", "sk-mr")
        == f"Bearer SK-MR-V1-…[redacted] and {redacted}"
    )
    assert redact_keys("openai/gpt-4o-mini", "sk-mr") == "openai/gpt-4o-mini"
    uuid = "app-v1-550e8400-e29b-41d4-a716-446655440000"  # a caller's own id: not a key of this gateway
    assert not holds_key(uuid, "sk-mr") and redact_keys(uuid, "sk-mr") == uuid
    assert holds_key("acme-v1-" + "x" * 43, "acme") and not holds_key(key, "acme")


@pytest.mark.parametrize("gateway", ["stack", "acme"])
def test_a_key_in_the_wrong_field_is_never_echoed_stored_or_logged(
    gateway: str, request: pytest.FixtureRequest, access_lines: Lines
) -> None:
    stack: Stack = request.getfixturevalue(gateway)  # the default key prefix (sk-mr), and acme
    prefix = stack.settings.server.key_prefix
    group = stack.group(10)
    key = stack.key(group=group)
    assert key.startswith(f"{prefix}-v1-")
    secret = key.split("-v1-", 1)[1]
    redacted = f"{prefix}-v1-…[redacted]"
    answers = []

    def refused(path: str, body: dict[str, Any], rid: str, kind: str) -> None:
        answer = post(stack, key, path, body, rid)
        assert answer.status == 404, answer.text
        error = answer.json()["error"]
        assert error["type"] == kind and redacted in error["message"], answer.text
        answers.append(answer)

    # the key sent as the model: the 404 names the model, redacted (chat, Messages, Responses)
    refused("/v1/chat/completions", {"model": key, "messages": HI}, "redact-chat", "invalid_request_error")
    refused(
        "/v1/chat/completions",
        {"model": f"openai/{key}", "messages": HI, "stream": True},
        "redact-chat-stream",
        "invalid_request_error",
    )
    refused(
        "/v1/messages", {"model": key, "max_tokens": 10, "messages": HI}, "redact-messages", "not_found_error"
    )
    refused("/v1/responses", {"model": key, "input": "hi"}, "redact-responses", "invalid_request_error")
    models = raw_request(
        stack,
        "GET",
        f"/v1/models/{key}",
        headers={"Authorization": f"Bearer {key}", "x-request-id": "redact-models"},
    )
    assert models.status == 404 and redacted in models.json()["error"]["message"], models.text
    answers.append(models)

    # the key sent as who the call is for: answered, and recorded without it
    served = [
        post(
            stack,
            key,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": HI,
                "max_tokens": 5,
                "user": key,
                "safety_identifier": f"id:{key}",
                "metadata": {"who": key},
            },
            "redact-user",
        ),
        post(
            stack,
            key,
            "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": HI, "metadata": {"user_id": key}},
            "redact-messages-user",
        ),
        post(
            stack,
            key,
            "/v1/embeddings",
            {"model": "openai/text-embedding-3-small", "input": "hi", "user": key},
            "redact-embeddings-user",
        ),
        post(
            stack,
            key,
            "/v1/responses",
            {
                "model": "anthropic/claude-haiku-4-5",
                "input": "hi",
                "max_output_tokens": 16,
                "user": key,
                "safety_identifier": key,
                "metadata": {"who": key},
            },
            "redact-responses-user",
        ),
    ]
    echoed = served[-1].json()  # a Response object echoes user and metadata: redacted
    assert (echoed["user"], echoed["metadata"]) == (redacted, {"who": redacted}), echoed
    stored = raw_request(
        stack, "GET", f"/v1/responses/{echoed['id']}", headers={"Authorization": f"Bearer {key}"}
    )
    assert stored.status == 200 and stored.json()["user"] == redacted, stored.text
    answers.append(stored)
    # the key sent as the request id: not taken (the gateway's own id instead)
    served.append(
        post(stack, key, "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 5}, key)
    )
    for answer in served:
        assert answer.status == 200, answer.text
    own_id = served[-1].headers["x-request-id"]
    assert own_id.startswith("req_") and secret not in own_id
    answers += served
    for answer in answers:
        assert secret not in answer.text and all(secret not in v for v in answer.headers.values()), (
            answer.text
        )

    records = stack.run(stack.store.usage(group=group))
    assert len(records) == 9  # (a GET is no call)
    for record in records:
        assert secret not in json.dumps(asdict(record)), record
    by_request = {r.request_id: r for r in records}
    assert {r.model for r in records if r.status == "rejected"} == {redacted, f"openai/{redacted}"}
    assert by_request["redact-chat"].error is not None and redacted in by_request["redact-chat"].error
    user = by_request["redact-user"]
    assert (user.end_user, user.safety_identifier, user.metadata) == (
        redacted,
        f"id:{redacted}",
        json.dumps({"who": redacted}, separators=(",", ":"), ensure_ascii=False),
    )
    assert by_request["redact-messages-user"].end_user == redacted
    assert by_request["redact-embeddings-user"].end_user == redacted
    assert by_request["redact-responses-user"].end_user == redacted
    assert by_request[own_id].status == "ok"

    lines = [
        access_lines.find(rid)
        for rid in (
            "redact-chat",
            "redact-chat-stream",
            "redact-messages",
            "redact-responses",
            "redact-models",
            "redact-user",
            own_id,
        )
    ]
    assert [line["model"] for line in lines[:4]] == [redacted, f"openai/{redacted}", redacted, redacted]
    assert lines[4]["path"] == f"/v1/models/{redacted}"
    assert all(secret not in line for line in access_lines.lines), [
        line for line in access_lines.lines if secret in line
    ]


def test_a_key_in_anthropics_metadata_user_id_goes_nowhere(stack: Any) -> None:
    import anthropic

    key = stack.key()
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{stack.port}", api_key=key, max_retries=0)
    stack.clients.append(client)  # closed after the test
    answer = client.messages.create(
        model="anthropic/claude-haiku-4-5",
        max_tokens=5,
        metadata={"user_id": f"me {key}"},
        messages=[{"role": "user", "content": "hi"}],
    )
    assert key not in answer.model_dump_json()
    sent = stack.emulator("anthropic").requests[-1]["metadata"]["user_id"]
    assert key not in sent and sent.startswith("me sk-mr-v1-")


@pytest.mark.parametrize("gateway", ["stack", "acme"])
def test_a_key_pasted_into_a_path_is_redacted_in_every_error_that_echoes_it(
    gateway: str, request: pytest.FixtureRequest, access_lines: Lines
) -> None:
    """Four 404s echoed the path, or the id in it, as sent (an unknown path, a stored response, a file,
    a batch), and the 405 too: now every error the app answers has a key of the gateway's redacted."""
    stack: Stack = request.getfixturevalue(gateway)
    prefix = stack.settings.server.key_prefix
    key = stack.key()
    secret, redacted = key.split("-v1-", 1)[1], f"{prefix}-v1-…[redacted]"
    asked = [
        ("GET", f"/v1/{key}", 404),
        ("GET", f"/{key}", 404),
        ("GET", f"/v1/messages/{key}", 404),
        ("GET", f"/v1/responses/{key}", 404),
        ("GET", f"/v1/responses/{key}/input_items", 404),
        ("DELETE", f"/v1/responses/{key}", 404),
        ("POST", f"/v1/responses/{key}/cancel", 404),
        ("GET", f"/v1/files/{key}", 404),
        ("GET", f"/v1/files/{key}/content", 404),
        ("DELETE", f"/v1/files/{key}", 404),
        ("GET", f"/v1/batches/{key}", 404),
        ("POST", f"/v1/batches/{key}/cancel", 404),
        ("POST", f"/v1/models/{key}", 405),
    ]
    for method, path, status in asked:
        answer = raw_request(
            stack, method, path, headers={"Authorization": f"Bearer {key}", "x-request-id": "in-path"}
        )
        assert answer.status == status and secret not in answer.text and redacted in answer.text, (
            path,
            answer.text,
        )
    answer = post(stack, key, "/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": key})
    assert answer.status == 404 and secret not in answer.text and redacted in answer.text, answer.text
    assert all(secret not in line for line in access_lines.lines)


def upload(stack: Stack, key: str, filename: str) -> Any:
    body = (
        b'--b0undary\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="'
        + filename.encode()
        + b'"\r\nContent-Type: application/jsonl\r\n\r\n{}\n\r\n--b0undary--\r\n'
    )
    return raw_request(
        stack,
        "POST",
        "/v1/files",
        body,
        {"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=b0undary"},
    )


def test_an_uploaded_files_name_is_checked_and_a_key_in_it_redacted(stack: Stack) -> None:
    """File names were stored as sent, whatever they held. Now a name too long, with a control character
    or a path separator is a 400 naming ``file``; a key in it is stored redacted; any other is kept."""
    key = stack.key()
    secret = key.split("-v1-", 1)[1]
    for bad in (
        "x" * 256 + ".jsonl",
        "../../etc/passwd",
        "dir\\batch.jsonl",
        "a\x01b.jsonl",
        "line\x7f.jsonl",
        "..",
    ):
        refused = upload(stack, key, bad)
        assert refused.status == 400, (bad, refused.text)
        assert (
            refused.json()["error"]["param"] == "file"
            and refused.json()["error"]["code"] == "invalid_file_name"
        )
    kept = upload(stack, key, "Lot 7 — 배치 (v2).jsonl")
    assert kept.status == 200 and kept.json()["filename"] == "Lot 7 — 배치 (v2).jsonl", kept.text
    pasted = upload(stack, key, f"mine {key}.jsonl")
    assert pasted.status == 200 and pasted.json()["filename"] == "mine sk-mr-v1-…[redacted].jsonl", (
        pasted.text
    )
    listed = raw_request(stack, "GET", "/v1/files", headers={"Authorization": f"Bearer {key}"})
    assert listed.status == 200 and secret not in listed.text and "Lot 7" in listed.text
