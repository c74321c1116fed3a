"""Malformed requests to every model endpoint, on every provider group, are a 4xx in the caller's dialect,
never a 5xx (docs/api.md, Errors).

Each endpoint has a valid request (``SEEDS``) that its JSON Schema (``GET /openapi.json``, made from the
request structs where there are some: router/openapi.py) describes. Hypothesis breaks it: one to three
places in it, or fields the schema names that it lacks, get a value of a JSON type the schema does not
allow there (any type where it says none), an integer of hundreds of digits, or nested junk. Each broken
body goes through a real gateway on loopback (emulated providers upstream) once per group prefix. The
examples are the same every run (``derandomize``) and few, so the module takes seconds."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.openapi import document
from tests.conftest import Stack, raw_request

PREFIXES = ("openai", "anthropic", "google", "upstage", "mistral")
CHAT = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-haiku-4-5",
    "google": "gemini-2.5-flash",
    "upstage": "solar-mini",
    "mistral": "mistral-small-latest",
}
EMBEDDING = {
    **CHAT,
    "openai": "text-embedding-3-small",
    "google": "gemini-embedding-001",
    "upstage": "embedding-query",
    "mistral": "mistral-embed",
}
IMAGE = {**CHAT, "openai": "gpt-image-1-mini", "google": "imagen-4.0-fast-generate-001"}
SERVED = {
    "/v1/embeddings": {"openai", "google", "upstage", "mistral"},
    "/v1/images/generations": {"openai", "google"},
}
SCHEMA = {"type": "object", "properties": {}}
HUGE = 10**400  # (401 digits)

SEEDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "/v1/chat/completions": lambda prefix: {
        "model": f"{prefix}/{CHAT[prefix]}",
        "max_tokens": 16,
        "temperature": 0.5,
        "top_p": 1,
        "n": 1,
        "stop": ["zz"],
        "user": "u",
        "stream": False,
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA}}],
    },
    "/v1/responses": lambda prefix: {
        "model": f"{prefix}/{CHAT[prefix]}",
        "instructions": "Be brief.",
        "max_output_tokens": 16,
        "temperature": 0.5,
        "top_p": 1,
        "store": False,
        "tool_choice": "auto",
        "text": {"format": {"type": "text"}},
        "metadata": {"a": "b"},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": SCHEMA},
            {
                "type": "namespace",
                "name": "ns",
                "description": "d",
                "tools": [{"type": "function", "name": "g", "parameters": SCHEMA}],
            },
        ],
    },
    "/v1/messages": lambda prefix: {
        "model": f"{prefix}/{CHAT[prefix]}",
        "max_tokens": 16,
        "temperature": 0.5,
        "stop_sequences": ["zz"],
        "metadata": {"user_id": "u"},
        **COUNTED(prefix),
    },
    "/v1/messages/count_tokens": lambda prefix: {"model": f"{prefix}/{CHAT[prefix]}", **COUNTED(prefix)},
    "/v1/embeddings": lambda prefix: {
        "model": f"{prefix}/{EMBEDDING[prefix]}",
        "input": ["hello", "world"],
        "encoding_format": "float",
        "user": "u",
    },
    "/v1/images/generations": lambda prefix: {
        "model": f"{prefix}/{IMAGE[prefix]}",
        "prompt": "a cat",
        "n": 1,
        "size": "1024x1024",
        "quality": "low",
        "response_format": "b64_json",
    },
}


def COUNTED(prefix: str) -> dict[str, Any]:  # noqa: N802  (the fields /v1/messages and count_tokens share)
    return {
        "system": [{"type": "text", "text": "Be brief."}],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
        "tools": [{"name": "f", "description": "d", "input_schema": SCHEMA}],
    }


# -- the schema: what each place of a body may hold ---------------------------------------------------------
DOCUMENT = document()
JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


def _resolve(schema: Any) -> dict[str, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        schema = DOCUMENT["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema if isinstance(schema, dict) else {}


def _branches(schema: Any) -> list[dict[str, Any]]:
    schema = _resolve(schema)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    return [b for alt in alternatives for b in _branches(alt)] if alternatives else [schema]


def allowed(schema: Any) -> set[str]:
    """The JSON types the schema allows (every type when it says nothing)."""
    types: set[str] = set()
    for branch in _branches(schema):
        kind = branch.get("type")
        if kind is None and "const" not in branch and "enum" not in branch:
            return set(JSON_TYPES)
        types |= set(kind) if isinstance(kind, list) else {kind} if kind else set()
        types |= {_type_of(v) for v in branch.get("enum", [branch["const"]] if "const" in branch else [])}
    return (
        types | ({"number"} if "integer" in types else set()) | ({"integer"} if "number" in types else set())
    )


def _type_of(value: Any) -> str:
    return {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }[type(value)]


def child(schema: Any, step: str | int) -> dict[str, Any]:
    """The schema of a field (``str``) or an item (``int``) of what ``schema`` describes ({} if unsaid)."""
    for branch in _branches(schema):
        if isinstance(step, str) and step in branch.get("properties", {}):
            return _resolve(branch["properties"][step])
        if isinstance(step, int) and "items" in branch:
            return _resolve(branch["items"])
    return {}


def places(
    body: Any, schema: Any, path: tuple[str | int, ...] = ()
) -> list[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every place of ``body`` with its schema, and the fields the schema names that an object lacks."""
    out: list[tuple[tuple[str | int, ...], dict[str, Any]]] = [(path, _resolve(schema))] if path else []
    if isinstance(body, dict):
        for name, value in body.items():
            out += places(value, child(schema, name), (*path, name))
        for branch in _branches(schema):
            out += [
                ((*path, name), _resolve(s))
                for name, s in branch.get("properties", {}).items()
                if name not in body
            ]
    elif isinstance(body, list):
        for i, value in enumerate(body):
            out += places(value, child(schema, i), (*path, i))
    return out


def request_schema(path: str) -> dict[str, Any]:
    return _resolve(DOCUMENT["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"])


# -- the values that break it -------------------------------------------------------------------------------
KEYS = st.sampled_from(["type", "text", "content", "tools", "name", "role", "input", "x"]) | st.text(
    max_size=4
)
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.just(HUGE),
    st.just(-HUGE),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JUNK = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=10
)
OF_TYPE = {
    "null": st.none(),
    "boolean": st.booleans(),
    "string": st.text(max_size=8),
    "integer": st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([HUGE, -HUGE, 2**63, 2**64, -1, 0])),
    "number": st.one_of(
        st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, -1e308, HUGE])
    ),
    "array": st.lists(JUNK, max_size=3),
    "object": st.dictionaries(KEYS, JUNK, max_size=3),
}


def wrong(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value the schema does not allow there: another JSON type (junk of any type where it says none),
    or where it allows a number, an integer past any bound."""
    kinds = allowed(schema)
    others = [t for t in JSON_TYPES if t not in kinds]
    outsized = [st.sampled_from([HUGE, -HUGE, 2**64])] if "integer" in kinds and others else []
    return st.one_of(st.sampled_from(others).flatmap(OF_TYPE.__getitem__), *outsized) if others else JUNK


def put(body: Any, path: tuple[str | int, ...], value: Any) -> None:
    for step in path[:-1]:
        body = body[step]
    body[path[-1]] = value


Change = tuple[tuple[str | int, ...], Any, bool]  # a place, its new value, whether the schema types the place


@st.composite
def broken(draw: st.DrawFn, endpoint: str) -> tuple[Change, ...]:
    """Changes to the seed of ``endpoint`` (applied per prefix: a path into the seed is the same whatever
    the model)."""
    where = places(SEEDS[endpoint]("openai"), request_schema(endpoint))
    changes = draw(st.lists(st.sampled_from(where), min_size=1, max_size=3, unique_by=lambda p: p[0]))
    changes.sort(key=lambda p: len(p[0]))  # (a place inside one changed before is gone: skipped)
    return tuple((path, draw(wrong(schema)), allowed(schema) != set(JSON_TYPES)) for path, schema in changes)


def apply(seed: dict[str, Any], changes: tuple[Change, ...]) -> dict[str, Any]:
    body = json.loads(json.dumps(seed))
    for path, value, _ in changes:
        try:
            put(body, path, value)
        except (KeyError, IndexError, TypeError):
            pass  # (inside a place an earlier change replaced)
    return body


# -- the assertions -----------------------------------------------------------------------------------------
def assert_refused_in_dialect(status: int, text: str, anthropic: bool, where: str) -> None:
    """Not a 5xx; an error in the caller's dialect: OpenAI's ``{"error": {message, type, param, code}}``,
    or Anthropic's ``{"type": "error", "error": {type, message}}``. A stream that began (200) has no
    error event of the gateway's own failing."""
    assert status < 500, (where, status, text[:400])
    if status >= 400:
        body = json.loads(text)
        if anthropic:
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, (where, text[:400])
            assert body["error"]["type"] != "api_error" and body["error"]["message"], (where, text[:400])
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}, (where, text[:400])
            assert body["error"]["type"] != "server_error" and body["error"]["message"], (where, text[:400])
    elif "event: error" in text or '"server_error"' in text or '"api_error"' in text:
        raise AssertionError((where, "an error event in a stream", text[-400:]))


def named(status: int, text: str, changes: tuple[Change, ...], anthropic: bool) -> bool:
    """The gateway's 400 for one value of a type the schema does not allow names the field (its first
    step: a check may name a place inside it). Junk where the schema says nothing, or a value the
    gateway takes and the provider refuses (its own words), may be refused for what it does to another
    place (an item replaced leaves a tool call unanswered)."""
    if status != 400 or len(changes) != 1 or not changes[0][2]:
        return True
    error = json.loads(text)["error"]
    if error["message"].startswith("The provider '"):
        return True
    said = error["message"] if anthropic else f"{error['param']} {error['message']}"
    return str(changes[0][0][0]) in said


EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("FUZZ_EXAMPLES"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def fuzz_key(stack: Stack) -> str:
    return stack.key(credits=1_000_000)


def _send(stack: Stack, key: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    anthropic = path.startswith("/v1/messages")
    auth = (
        {"x-api-key": key, "anthropic-version": "2023-06-01"}
        if anthropic
        else {"Authorization": f"Bearer {key}"}
    )
    r = raw_request(
        stack, "POST", path, json.dumps(body).encode(), {**auth, "Content-Type": "application/json"}
    )
    return r.status, r.text


@pytest.mark.parametrize("path", list(SEEDS))
def test_the_seeds_are_served_on_every_group_that_has_the_endpoint(
    stack: Stack, fuzz_key: str, path: str
) -> None:
    """What the fuzz breaks is a valid request (else every change would be refused for the seed's fault)."""
    for prefix in PREFIXES:
        status, text = _send(stack, fuzz_key, path, SEEDS[path](prefix))
        assert (status == 200) == (prefix in SERVED.get(path, PREFIXES)), (path, prefix, status, text[:400])


def _fuzz(path: str) -> Callable[..., None]:
    @FUZZ
    @given(changes=broken(path))
    def test(stack: Stack, fuzz_key: str, changes: tuple[Any, ...]) -> None:
        anthropic = path.startswith("/v1/messages")
        for prefix in PREFIXES:
            status, text = _send(stack, fuzz_key, path, apply(SEEDS[path](prefix), changes))
            where = f"{prefix} {path} {changes!r:.300}"
            assert_refused_in_dialect(status, text, anthropic, where)
            if prefix in SERVED.get(path, PREFIXES):  # (elsewhere the model is refused first)
                assert named(status, text, changes, anthropic), (
                    where,
                    "the 400 does not name the field",
                    text[:400],
                )

    return test


test_chat_completions_malformed = _fuzz("/v1/chat/completions")
test_responses_malformed = _fuzz("/v1/responses")
test_messages_malformed = _fuzz("/v1/messages")
test_count_tokens_malformed = _fuzz("/v1/messages/count_tokens")
test_embeddings_malformed = _fuzz("/v1/embeddings")
test_images_malformed = _fuzz("/v1/images/generations")


BATCH_SCHEMA = _resolve(
    DOCUMENT["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["schema"]
)


@FUZZ
@given(
    line=broken("/v1/chat/completions"),
    batch=st.lists(
        st.sampled_from(
            places({"input_file_id": "", "endpoint": "", "completion_window": ""}, BATCH_SCHEMA)
        ).flatmap(lambda p: st.tuples(st.just(p[0]), wrong(p[1]), st.just(True))),
        max_size=1,
    ),
)
def test_batches_of_malformed_lines_and_malformed_batches(
    stack: Stack, fuzz_key: str, line: tuple[Any, ...], batch: list[Any]
) -> None:
    """A batch input file of broken lines (one per group) is uploaded, and a batch of it created (with a
    broken field, or none): each a 4xx or accepted, never a 5xx."""
    client = stack.client(fuzz_key)
    lines = [
        json.dumps(
            {
                "custom_id": prefix,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": apply(SEEDS["/v1/chat/completions"](prefix), line),
            }
        )
        for prefix in PREFIXES
    ]
    try:
        upload = client.files.create(file=("broken.jsonl", "\n".join(lines).encode()), purpose="batch")
    except openai.APIStatusError as exc:
        assert_refused_in_dialect(exc.status_code, exc.response.text, False, f"upload {line!r:.300}")
        return
    body = apply(
        {"input_file_id": upload.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        tuple(batch),
    )
    r = raw_request(
        stack,
        "POST",
        "/v1/batches",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
    )
    assert_refused_in_dialect(r.status, r.text, False, f"batch {line!r:.300} {batch!r:.200}")
    if r.status == 200:  # (one that failed validation meanwhile cannot be: 409)
        cancel = raw_request(
            stack,
            "POST",
            f"/v1/batches/{r.json()['id']}/cancel",
            b"",
            {"Authorization": f"Bearer {fuzz_key}"},
        )
        assert_refused_in_dialect(cancel.status, cancel.text, False, "cancel")


# -- the shapes the probe of issue 56 found ------------------------------------------------------------------
def test_a_tool_results_content_of_another_type_is_a_400_naming_it(stack: Stack, fuzz_key: str) -> None:
    """``tool_result.content`` is a string or a list of blocks (anthropic-sdk-python's ToolResultBlockParam);
    a number was a 500 for every model (the worst case's image count iterated it)."""
    claude = stack.anthropic_client(fuzz_key)
    for prefix in PREFIXES:
        for value in (5, HUGE, {"type": "text"}, True):
            body = SEEDS["/v1/messages"](prefix)
            body["messages"][2]["content"][0]["content"] = value
            for count in (False, True):
                with pytest.raises(anthropic.BadRequestError) as refused:
                    if count:
                        claude.messages.count_tokens(model=body["model"], messages=body["messages"])
                    else:
                        claude.messages.create(model=body["model"], max_tokens=16, messages=body["messages"])
                error = refused.value.body["error"]  # type: ignore[index]
                assert (
                    error["type"] == "invalid_request_error" and "messages.2.content.0" in error["message"]
                ), (prefix, value, error)


def test_a_count_of_a_system_of_another_type_is_a_400_naming_it(stack: Stack, fuzz_key: str) -> None:
    """The Anthropic emulator counted ``system: 5`` with a 500 where Anthropic answers 400."""
    claude = stack.anthropic_client(fuzz_key)
    for prefix in PREFIXES:
        for value in (5, HUGE, True, [5], {"type": "text"}):
            with pytest.raises(anthropic.BadRequestError) as refused:
                claude.messages.count_tokens(
                    model=f"{prefix}/{CHAT[prefix]}",
                    system=value,  # type: ignore[arg-type]
                    messages=[{"role": "user", "content": "hi"}],
                )
            error = refused.value.body["error"]  # type: ignore[index]
            assert error["type"] == "invalid_request_error" and "system" in error["message"], (
                prefix,
                value,
                error,
            )


def test_a_namespace_whose_tools_are_not_a_list_is_a_400_naming_them(stack: Stack, fuzz_key: str) -> None:
    """A ``namespace`` tool holds a list of function tools; another type was a 500 on translated groups."""
    client = stack.client(fuzz_key)
    for prefix in PREFIXES:
        for value in (5, HUGE, "f", {"type": "function", "name": "g"}, None):
            body = SEEDS["/v1/responses"](prefix)
            body["tools"][1]["tools"] = value
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(**body)
            said = f"{refused.value.param} {refused.value.message}"  # type: ignore[attr-defined]
            assert "tools[1].tools" in said, (prefix, value, said)
