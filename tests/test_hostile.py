"""Hostile input: each case gets a clear error or a closed connection, never a crash or a leak, and
the gateway keeps serving (docs/api.md, Errors)."""

from __future__ import annotations

import json
import os
import socket
import time

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Stack, raw_request


def _post(stack: Stack, body: bytes, key: str, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    r = raw_request(
        stack, "POST", path, body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    return r.status, r.json()


ENDPOINTS = pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
CALL = b'{"model":"openai/gpt-4o-mini","messages":[{"role":"user","content":"x"}],"input":"x",'


@ENDPOINTS
def test_deeply_nested_json(stack: Stack, path: str) -> None:
    key = stack.key()
    deep = CALL + b'"metadata":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, body = _post(stack, deep, key, path)
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = _post(stack, b"[" * 100_000, key, path)
    assert status == 400 and body["error"]["code"] == "invalid_json"


_TEXT = st.text(alphabet='ab[]{}"\\/:,é \n', max_size=6)  # (brackets, quotes and backslashes in strings)
DOCUMENT = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=40,
)


@given(value=DOCUMENT, limit=st.integers(1, 8), ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_depth_read_from_the_bytes_is_the_decoded_values(
    value: object, limit: int, ascii_only: bool, indent: int | None
) -> None:
    """decode_json reads a body's nesting from its bytes (core.inputs.nests_deeper), brackets, quotes and
    backslashes in its strings included: it says what the walk of the decoded value says."""
    from core.inputs import nests_deeper, too_deep

    assert nests_deeper(
        json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode(), limit
    ) == too_deep(value, limit)


@given(
    value=DOCUMENT | st.dictionaries(st.sampled_from(["tools", "input", "a"]), DOCUMENT, max_size=3),
    indent=st.sampled_from([None, 1]),
)
def test_an_object_read_field_by_field_is_the_whole_documents_value(
    value: object, indent: int | None
) -> None:
    """decode_object (the Responses body, its tools kept by their bytes) gives what decode_json gives,
    the second time too (the kept value), or the same error."""
    from core.errors import InvalidRequest
    from core.inputs import decode_json, decode_object

    document = json.dumps(value, indent=indent).encode()
    assert decode_object(document, "tools")[0] == decode_json(document)
    again, sent = decode_object(document, "tools")
    assert again == value
    assert (sent is not None) == (isinstance(value, dict) and "tools" in value)
    if sent is not None and isinstance(again["tools"], list | dict):  # (decoded once, shared)
        assert decode_object(document, "tools")[0]["tools"] is again["tools"]
    for other in (document + b"x", document.replace(b'"a', b'"\xff'), b"[" * 130 + b"]" * 130):
        outcomes = []
        for decode in (decode_json, lambda body: decode_object(body, "tools")[0]):
            try:
                outcomes.append(decode(other))
            except InvalidRequest as exc:
                outcomes.append(exc.message)
        assert outcomes[0] == outcomes[1]


def test_an_object_is_as_deep_as_its_deepest_field_kept_or_not() -> None:
    """decode_object reads each field's depth one level inside the body: a body 128 deep passes, one
    129 deep is a 400, whether the deep field is the kept one (seen before or not) or another."""
    from core.errors import InvalidRequest
    from core.inputs import MAX_DEPTH, decode_object

    for name in ("tools", "input"):
        fits = b'{"model":"m","%s":' % name.encode() + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
        deep = b'{"model":"m","%s":' % name.encode() + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
        for _ in range(2):
            assert decode_object(fits, "tools")[0]["model"] == "m"
            with pytest.raises(InvalidRequest, match="nested more than"):
                decode_object(deep, "tools")


@ENDPOINTS
def test_invalid_utf8(stack: Stack, path: str) -> None:
    status, body = _post(stack, CALL + b'"user":"\xff\xfe"}', stack.key(), path)
    assert status == 400 and body["error"]["code"] == "invalid_json"


def test_absurd_max_tokens(client: openai.OpenAI) -> None:
    for value in (10**15, 2**70):
        try:
            client.chat.completions.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}], max_tokens=value
            )
            raise AssertionError("accepted")
        except openai.BadRequestError as exc:
            assert exc.param == "max_tokens"  # type: ignore[attr-defined]
    try:  # within our bound but over the model's ceiling
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}], max_tokens=1_000_000
        )
        raise AssertionError("accepted")
    except openai.BadRequestError as exc:
        assert "16384" in exc.message


def test_thousands_of_messages(stack: Stack, client: openai.OpenAI) -> None:
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(4001)]
    out = client.chat.completions.create(model="openai/gpt-4o-mini", messages=many)
    assert out.usage is not None and out.usage.prompt_tokens > 8000
    too_many = many * 6
    status, body = _post(
        stack, json.dumps({"model": "openai/gpt-4o-mini", "messages": too_many}).encode(), stack.key()
    )
    assert status == 400 and body["error"]["param"] == "messages"


def test_huge_header_is_refused(stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", stack.port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        sock.settimeout(5)
        answer = b""
        try:
            while piece := sock.recv(65536):
                answer += piece
        except (ConnectionResetError, TimeoutError):
            pass
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4")


def test_slow_body_gets_408(stack: Stack) -> None:
    stack.gateway.settings.reliability.body_timeout = 0.5
    try:
        with socket.create_connection(("127.0.0.1", stack.port)) as sock:
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.key()}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
            )
            sock.settimeout(5)
            began = time.monotonic()
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - began < 3
    finally:
        stack.gateway.settings.reliability.body_timeout = 30.0


def test_keys_never_echoed(stack: Stack) -> None:
    secret = "sk-mr-v1-" + "S" * 43
    r = raw_request(
        stack,
        "POST",
        "/v1/chat/completions",
        b"{}",
        {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    assert r.status == 401 and secret.encode() not in r.body and b"SSSS" not in r.body


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "wizard"]),
        "content": st.one_of(st.text(max_size=30), st.none(), st.integers(), st.lists(JSONISH, max_size=3)),
    }
)
REQUEST = st.fixed_dictionaries(
    {
        "model": st.one_of(
            st.sampled_from(["openai/gpt-4o-mini", "mistral/mistral-small-latest", "nope/x"]), st.integers()
        ),
        "messages": st.one_of(st.lists(MESSAGE, max_size=3), JSONISH),
    },
    optional={
        "max_tokens": st.one_of(st.integers(min_value=-5, max_value=50), st.text(max_size=3)),
        "temperature": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3)),
        "stream": st.booleans(),
        "n": st.integers(min_value=-1, max_value=3),
        "stream_options": JSONISH,
        "tools": JSONISH,
        "stop": JSONISH,
        "extra": JSONISH,
        "tool_choice": JSONISH,
        "response_format": st.one_of(
            JSONISH,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["json_schema", "json_object", "text", "x"])},
                optional={"json_schema": JSONISH},
            ),
        ),
    },
)


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=not os.environ.get("FUZZ_EXAMPLES"),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=REQUEST)
def test_fuzzed_requests_never_5xx(stack: Stack, body: dict) -> None:
    key = stack.key() if not hasattr(stack, "_fuzz_key") else stack._fuzz_key  # type: ignore[attr-defined]
    stack._fuzz_key = key  # type: ignore[attr-defined]
    r = raw_request(
        stack,
        "POST",
        "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert r.status < 500, (r.status, r.text[:300])
    if r.status >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


PART = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text", "input_image", "input_file", "x"])},
        optional={"text": JSONISH, "image_url": JSONISH, "detail": JSONISH},
    ),
    JSONISH,
)
ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "wizard"])},
        optional={
            "type": st.just("message"),
            "content": st.one_of(st.text(max_size=20), st.lists(PART, max_size=3), JSONISH),
        },
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["function_call", "function_call_output", "item_reference", "reasoning", "x"]
            )
        },
        optional={
            "call_id": JSONISH,
            "name": JSONISH,
            "arguments": JSONISH,
            "output": JSONISH,
            "id": JSONISH,
        },
    ),
    JSONISH,
)
RESPONSES_REQUEST = st.fixed_dictionaries(
    {
        "model": st.one_of(
            st.sampled_from(
                [
                    "openai/gpt-4o-mini",
                    "anthropic/claude-haiku-4-5",
                    "google/gemini-2.5-flash",
                    "mistral/mistral-small-latest",
                    "nope/x",
                ]
            ),
            st.integers(),
        ),
        "input": st.one_of(st.text(max_size=30), st.lists(ITEM, max_size=3), JSONISH),
    },
    optional={
        "instructions": JSONISH,
        "max_output_tokens": st.one_of(st.integers(min_value=-5, max_value=50), JSONISH),
        "temperature": JSONISH,
        "stream": st.booleans(),
        "tools": st.one_of(st.lists(JSONISH, max_size=2), JSONISH),
        "tool_choice": JSONISH,
        "text": JSONISH,
        "reasoning": JSONISH,
        "store": JSONISH,
        "previous_response_id": JSONISH,
        "extra": JSONISH,
    },
)


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=not os.environ.get("FUZZ_EXAMPLES"),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=RESPONSES_REQUEST)
def test_fuzzed_responses_requests_never_5xx(stack: Stack, body: dict) -> None:
    key = stack.key() if not hasattr(stack, "_fuzz_key") else stack._fuzz_key  # type: ignore[attr-defined]
    stack._fuzz_key = key  # type: ignore[attr-defined]
    r = raw_request(
        stack,
        "POST",
        "/v1/responses",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert r.status < 500, (r.status, r.text[:300])
    if r.status >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def _responses(stack: Stack, body: bytes, key: str) -> tuple[int, dict]:
    r = raw_request(
        stack,
        "POST",
        "/v1/responses",
        body,
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    return r.status, r.json()


def test_responses_bad_bodies_are_400s_naming_the_field(stack: Stack) -> None:
    key = stack.key()
    status, body = _responses(stack, b'{"model":"mistral/mistral-small-latest","input":"\xff\xfe"}', key)
    assert status == 400 and body["error"]["code"] == "invalid_json"
    for depth in (129, 1_000, 20_000):
        deep = (
            b'{"model":"mistral/mistral-small-latest","input":"x","metadata":'
            + b"[" * depth
            + b"]" * depth
            + b"}"
        )
        status, body = _responses(stack, deep, key)
        assert (
            status == 400 and body["error"]["code"] == "invalid_json" and "nested" in body["error"]["message"]
        )
    cases = {
        "input[0].role": {"input": [{"role": {"x": 1}, "content": "hi"}]},
        "input[0].content[0].type": {
            "input": [{"role": "user", "content": [{"type": {"x": 1}, "text": "hi"}]}]
        },
        "input[0].type": {"input": [{"type": ["message"], "role": "user", "content": "hi"}]},
        "input[0].content[0]": {"input": [{"role": "user", "content": [["input_text"]]}]},
        "tools[0].type": {"input": "hi", "tools": [{"type": {"function": 1}, "name": "f"}]},
    }
    for param, fields in cases.items():
        status, body = _responses(
            stack, json.dumps({"model": "mistral/mistral-small-latest", **fields}).encode(), key
        )
        assert status == 400 and body["error"]["param"] == param, (param, status, body)
    detail = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": {"x": 1}}
                ],
            }
        ]
    }
    status, _ = _responses(
        stack, json.dumps({"model": "mistral/pixtral-large-latest", **detail}).encode(), key
    )
    assert status < 500


def test_chat_nesting_is_bounded_where_the_body_is_read(stack: Stack) -> None:
    """msgspec decodes up to ~970 levels, and everything after it that walks the body (convert, the
    upstream's encoder, the translators) recurses on a deeper stack; such a body used to go upstream
    (or, a few levels deeper, fail with a 500). The depth is bounded where the body is decoded."""
    for depth in (129, 900, 960):
        deep = (
            b'{"model":"openai/gpt-4o-mini","messages":[{"role":"user","content":"x"}],"metadata":'
            + b"[" * depth
            + b"]" * depth
            + b"}"
        )
        status, body = _post(stack, deep, stack.key())
        assert status == 400 and body["error"]["code"] == "invalid_json", (depth, status, body)
    ok = (
        b'{"model":"openai/gpt-4o-mini","messages":[{"role":"user","content":"x"}],"metadata":'
        + b"[" * 100
        + b"]" * 100
        + b"}"
    )
    assert _post(stack, ok, stack.key())[0] == 200


def test_files_and_batches_bad_parameters_are_400s(stack: Stack) -> None:
    key = {"Authorization": f"Bearer {stack.key()}"}
    for query in ("limit=%C2%B2", "limit=99999999999999999999999", "limit=-1"):  # "²".isdigit() is True
        r = raw_request(stack, "GET", f"/v1/files?{query}", headers=key)
        assert r.status == 400 and r.json()["error"]["param"] == "limit", (query, r.status, r.text[:200])
        r = raw_request(stack, "GET", f"/v1/batches?{query}", headers=key)
        assert r.status == 400 and r.json()["error"]["param"] == "limit", (query, r.status, r.text[:200])
    for body in (
        b'{"input_file_id":"\xff"}',
        b"[" * 5_000,
        b'{"metadata":' + b"[" * 2_000 + b"]" * 2_000 + b"}",
    ):
        r = raw_request(stack, "POST", "/v1/batches", body, {**key, "Content-Type": "application/json"})
        assert r.status == 400 and r.json()["error"]["code"] == "invalid_json", (r.status, r.text[:200])
