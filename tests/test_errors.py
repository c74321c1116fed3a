"""Every bad input gets its clear OpenAI-shaped error, and the server keeps serving (docs/api.md, "Errors")."""

from __future__ import annotations

import json
import socket
from typing import Any

import anthropic
import openai
import pytest

from emulators.anthropic import ORGANIZATION as ANTHROPIC_ORGANIZATION
from emulators.openai import ORGANIZATION as OPENAI_ORGANIZATION
from tests.conftest import Stack, raw_request


def _post(
    stack: Stack, body: bytes, key: str | None = None, ctype: str = "application/json"
) -> tuple[int, dict]:
    headers = {"Content-Type": ctype}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    r = raw_request(stack, "POST", "/v1/chat/completions", body, headers)
    return r.status, r.json()


def _assert_shape(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    return err


def test_missing_key(stack: Stack) -> None:
    status, body = _post(stack, b'{"model":"openai/gpt-4o","messages":[{"role":"user","content":"x"}]}')
    assert status == 401
    assert _assert_shape(body)["code"] == "missing_api_key"


@pytest.mark.parametrize(
    "key", ["nonsense", "sk-mr-v1-short", "sk-other-v1-" + "a" * 43, "sk-mr-v1-" + "a" * 43]
)
def test_bad_keys_are_401(stack: Stack, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        stack.client(key).chat.completions.create(
            model="openai/gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 401
    assert key not in str(info.value.body)  # a key never appears in an error


def test_revoked_key_is_rejected(stack: Stack) -> None:
    key = stack.key()
    client = stack.client(key)
    client.chat.completions.create(model="openai/gpt-4o", messages=[{"role": "user", "content": "x"}])
    key_id = stack.run(stack.store.list_keys())[-1].id
    stack.run(stack.store.revoke_key(key_id))
    stack.gateway.auth.forget()
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="openai/gpt-4o", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        (b'{"messages":[{"role":"user","content":"x"}]}', "model", "missing_required_parameter"),
        (b'{"model":"openai/gpt-4o"}', "messages", "missing_required_parameter"),
        (b'{"model":"openai/gpt-4o","messages":[]}', "messages", "invalid_value"),
        (b'{"model":42,"messages":[{"role":"user","content":"x"}]}', "model", "invalid_value"),
        (
            b'{"model":"openai/gpt-4o","messages":[{"role":"wizard","content":"x"}]}',
            "messages[0].role",
            "invalid_value",
        ),
        (
            b'{"model":"openai/gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":-5}',
            "max_tokens",
            "invalid_value",
        ),
        (
            b'{"model":"openai/gpt-4o","messages":[{"role":"user","content":"x"}],"temperature":"hot"}',
            "temperature",
            "invalid_value",
        ),
        (
            b'{"model":"openai/gpt-4o","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}',
            "stream_options",
            "invalid_value",
        ),
        (b'\xff\xfe{"model": 1}', None, "invalid_json"),
    ],
)
def test_bad_bodies_are_400(stack: Stack, body: bytes, param: str | None, code: str) -> None:
    status, answer = _post(stack, body, stack.key())
    assert status == 400
    err = _assert_shape(answer)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param and err["code"] == code


def test_sdk_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="openai/gpt-4o", messages=[])
    assert info.value.param == "messages"  # type: ignore[attr-defined]


def test_non_json_content_type(stack: Stack) -> None:
    status, body = _post(stack, b"model=x", stack.key(), ctype="application/x-www-form-urlencoded")
    assert status == 415
    assert _assert_shape(body)["code"] == "unsupported_content_type"


def _read_response(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            break
        if not piece:
            break
        data += piece
    return data


def test_oversized_body_by_content_length(stack: Stack) -> None:
    limit = stack.settings.server.max_body_bytes
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.key()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {limit + 10}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", stack.port)) as sock:
        sock.sendall(head.encode() + b'{"model": "' + b"x" * 1000)
        answer = _read_response(sock)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    assert b"connection: close" in rest.lower()  # answered at once; the rest of the body is never read
    err = _assert_shape(json.loads(rest.split(b"\r\n\r\n", 1)[1]))
    assert err["code"] == "request_too_large"


def test_oversized_body_chunked(stack: Stack) -> None:
    limit = stack.settings.server.max_body_bytes
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.key()}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", stack.port)) as sock:
        sock.settimeout(10)
        sock.sendall(head.encode())
        try:
            for _ in range(limit // len(piece) + 2):
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_response(sock)
    assert answer.startswith(b"HTTP/1.1 413")


def test_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="openai/gpt-9000", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9000", messages=[{"role": "user", "content": "x"}])
    assert "<provider>/<model_name>" in info.value.message
    # a bare id that names one catalog model is that model, echoed as sent
    answer = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert answer.model == "gpt-4o"


@pytest.mark.parametrize(
    ("model", "code"),
    [
        ("openai/gpt-image-1", "unsupported_model_endpoint"),
        ("openai/gpt-5-codex", "unsupported_model_endpoint"),
        ("google/imagen-4.0-generate-001", "unsupported_model_endpoint"),
    ],
)
def test_model_that_cannot_chat(client: openai.OpenAI, model: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert info.value.code == code  # type: ignore[attr-defined]


def test_image_refused_for_text_only_model(stack: Stack, client: openai.OpenAI) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    message = {"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}
    for model in ("upstage/solar-mini", "openai/gpt-4o-search-preview", "mistral/mistral-large-latest"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model, messages=[message])
        assert info.value.code == "image_input_unsupported"  # type: ignore[attr-defined]
    out = client.chat.completions.create(model="openai/gpt-5-mini", messages=[message])
    assert out.choices[0].message.content
    assert stack.emulator("openai").requests[-1]["messages"][0]["content"][1] == image


# OpenAI's model pages (docs/providers.md, "Model capabilities"): text and image input
@pytest.mark.parametrize(
    "model",
    [
        "openai/gpt-4o",
        "openai/gpt-4o-mini",
        "openai/gpt-4.1",
        "openai/chatgpt-4o-latest",
        "openai/o3",
        "openai/o4-mini",
    ],
)
def test_image_accepted_by_openai_vision_models(stack: Stack, client: openai.OpenAI, model: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    message = {"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}
    out = client.chat.completions.create(model=model, messages=[message])
    assert out.choices[0].message.content and out.model == model
    sent = stack.emulator("openai").requests[-1]
    assert (
        sent["model"] == stack.gateway.catalog.resolve(model).upstream
        and sent["messages"][0]["content"][1] == image
    )


WEATHER_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


# no function calling on the provider's model page (docs/providers.md, "Model capabilities")
@pytest.mark.parametrize(
    "model",
    [
        "openai/chatgpt-4o-latest",
        "openai/gpt-4o-search-preview",
        "openai/gpt-4o-mini-search-preview",
        "google/gemini-2.5-flash-image-preview",
    ],
)
def test_tools_refused_for_a_model_without_them(stack: Stack, client: openai.OpenAI, model: str) -> None:
    emulator = stack.emulator(stack.gateway.catalog.resolve(model).provider)
    before = len(emulator.requests)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Seoul? [tool]"}],
                tools=WEATHER_TOOL,
                stream=stream,
            )  # type: ignore[arg-type]
        assert info.value.code == "tools_unsupported" and info.value.param == "tools"  # type: ignore[attr-defined]
        assert f"`{model}` does not support tools" in info.value.message
    assert len(emulator.requests) == before  # refused before any upstream call
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}])
    assert out.choices[0].finish_reason == "stop"  # the same model answers without tools
    listed = client.models.retrieve(model).model_extra or {}
    assert (
        listed["tools"] is False
        and (client.models.retrieve("openai/gpt-4o").model_extra or {})["tools"] is True
    )


def test_tools_refused_on_responses_for_a_model_without_them(stack: Stack, client: openai.OpenAI) -> None:
    before = len(stack.emulator("openai").requests)
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="openai/chatgpt-4o-latest", input="Seoul? [tool]", tools=[tool])  # type: ignore[list-item]
    assert info.value.code == "tools_unsupported" and info.value.param == "tools"  # type: ignore[attr-defined]
    assert len(stack.emulator("openai").requests) == before
    out = client.responses.create(model="openai/chatgpt-4o-latest", input="hello")
    assert out.status == "completed" and out.output_text


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ("[fault:429]", openai.RateLimitError, 429),
        ("[fault:500]", openai.InternalServerError, 502),
        ("[fault:503]", openai.InternalServerError, 503),
    ],
)
@pytest.mark.parametrize(
    "model", ["openai/gpt-4o-mini", "mistral/mistral-small-latest", "upstage/solar-mini"]
)
def test_upstream_errors_are_mapped(
    client: openai.OpenAI, model: str, fault: str, error: type, status: int
) -> None:
    for stream in (False, True):
        with pytest.raises(error) as info:
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": fault}], stream=stream
            )
            if stream:
                list(out)  # type: ignore[arg-type]
        assert info.value.status_code == status  # type: ignore[attr-defined]
        if status == 429:
            assert info.value.response.headers.get("retry-after") == "1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("model", "organization"),
    [("openai/gpt-4o-mini", OPENAI_ORGANIZATION), ("anthropic/claude-haiku-4-5", ANTHROPIC_ORGANIZATION)],
)
def test_an_upstream_rate_limit_does_not_name_the_gateways_account(
    stack: Stack, model: str, organization: str
) -> None:
    """A provider's 429 names the gateway's organization and its usage (all tenants' together): the
    caller gets the provider's Retry-After, not its words."""
    prefix = model.split("/")[0]
    emulator = stack.emulators[prefix]
    ask: dict[str, Any] = {"messages": [{"role": "user", "content": "[fault:429]"}], "max_tokens": 5}
    if prefix == "openai":  # the provider's own answer names it (what the gateway must not pass on)
        with openai.OpenAI(base_url=emulator.base_url, api_key=emulator.api_key, max_retries=0) as direct:
            with pytest.raises(openai.RateLimitError) as upstream:
                direct.chat.completions.create(model="gpt-4o-mini", **ask)
        assert organization in upstream.value.message and "Used" in upstream.value.message
    else:
        root = emulator.base_url.removesuffix("/v1")
        with anthropic.Anthropic(base_url=root, api_key=emulator.api_key, max_retries=0) as direct_a:
            with pytest.raises(anthropic.RateLimitError) as refused:
                direct_a.messages.create(model="claude-haiku-4-5", **ask)
        assert organization in refused.value.message
    client = stack.client()
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as info:
            out = client.chat.completions.create(model=model, stream=stream, **ask)
            if stream:
                list(out)  # type: ignore[arg-type]
        said = info.value.message
        assert (
            f"provider '{prefix}' is rate limiting" in said
            and info.value.response.headers["retry-after"] == "1"
        )
        assert organization not in said and "organization" not in said and "Used" not in said


def test_upstream_failure_mid_stream_is_an_sse_error_event(stack: Stack) -> None:
    key = stack.key()
    for directive in ("[midfail]", "[cut:2]", "[malformed]"):
        body = json.dumps(
            {
                "model": "openai/gpt-4o-mini",
                "stream": True,
                "messages": [{"role": "user", "content": directive}],
            }
        ).encode()
        r = raw_request(
            stack,
            "POST",
            "/v1/chat/completions",
            body,
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        assert r.status == 200
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: ") :])
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert not any('finish_reason":"stop' in e for e in events)
    with pytest.raises(openai.APIError):
        list(
            stack.client(key).chat.completions.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "[cut:2]"}], stream=True
            )
        )


def test_upstream_credentials_rejected_blames_the_gateway(stack: Stack) -> None:
    from core.deployments import Deployment
    from tests.conftest import use_deployment

    gw = stack.gateway
    good = use_deployment(gw, Deployment("upstage", gw.providers["upstage"].base_url, "wrong-key", 5, 30))
    try:
        with pytest.raises(openai.APIStatusError) as info:
            stack.client().chat.completions.create(
                model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.status_code == 502
        assert "gateway" in info.value.message and "not a problem with your API key" in info.value.message
    finally:
        use_deployment(gw, good)


def test_unreachable_upstream_is_503(stack: Stack) -> None:
    from core.deployments import Deployment
    from tests.conftest import free_port, use_deployment

    gw = stack.gateway
    good = use_deployment(gw, Deployment("mistral", f"http://127.0.0.1:{free_port()}/v1", "k", 2, 30))
    try:
        with pytest.raises(openai.InternalServerError) as info:
            stack.client().chat.completions.create(
                model="mistral/codestral-latest", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.status_code == 503
    finally:
        use_deployment(gw, good)


def test_unknown_path_and_method(stack: Stack) -> None:
    r = raw_request(stack, "GET", "/v1/nothing-here")
    assert r.status == 404 and _assert_shape(r.json())["type"] == "invalid_request_error"
    r = raw_request(stack, "GET", "/v1/chat/completions")
    assert r.status == 405 and _assert_shape(r.json())["code"] == "method_not_allowed"


def test_a_trailing_slash_is_served_after_authentication_never_redirected_to_the_host(stack: Stack) -> None:
    """``/v1/chat/completions/`` was answered ``307 Location: http://<Host>/v1/chat/completions`` before
    the key was checked (Starlette's redirect_slashes): behind a proxy that forwards Host, an open
    redirect (and http behind TLS). Now a ``/v1`` path with a trailing slash is served as the path
    without it, key first; and what is still redirected (``/console`` to ``/console/``) carries no
    scheme or host."""
    body = json.dumps(
        {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    foreign = {"Host": "evil.example", "Content-Type": "application/json"}
    bare = raw_request(stack, "POST", "/v1/chat/completions/", body, foreign)
    assert bare.status == 401 and "location" not in bare.headers
    assert _assert_shape(bare.json())["code"] == "missing_api_key"
    keyed = raw_request(
        stack, "POST", "/v1/chat/completions/", body, {**foreign, "Authorization": f"Bearer {stack.key()}"}
    )
    assert (
        keyed.status == 200
        and "location" not in keyed.headers
        and keyed.json()["choices"][0]["message"]["content"]
    )
    models = raw_request(stack, "GET", "/v1/models//?x=1", headers={"Host": "evil.example"})
    assert models.status == 401 and "location" not in models.headers
    anthropic_dialect = raw_request(stack, "POST", "/v1/messages/", b"{}", foreign)
    assert anthropic_dialect.status == 401 and anthropic_dialect.json()["type"] == "error"
    unknown = raw_request(stack, "GET", "/v1/nothing-here/", headers={"Host": "evil.example"})
    assert unknown.status == 404 and "location" not in unknown.headers
    for path, there in (("/console", "/console/"), ("/healthz/", "/healthz")):
        moved = raw_request(stack, "GET", path, headers={"Host": "evil.example"})
        assert moved.status == 307 and moved.headers["location"] == there, (path, moved.status, moved.headers)


def test_server_keeps_serving_after_errors(stack: Stack, client: openai.OpenAI) -> None:
    for body in (b"{", b"[]", b'{"model": 1}', b"\x00" * 100):
        _post(stack, body, stack.key())
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "still there?"}]
    )
    assert out.choices[0].message.content


def test_an_error_before_the_body_is_read_still_reaches_a_caller_sending_a_large_one(stack: Stack) -> None:
    """The endpoint refuses (a wrong content type, a bad key) before reading the body: the gateway reads
    and drops the body, then answers, so a caller still sending several MB is not left blocked (the
    server had stopped reading) and the connection serves the next request."""
    body = b"x" * (6 * 1024 * 1024)  # more than the sockets' buffers hold
    cases = (
        ("/v1/chat/completions", f"Bearer {stack.key()}", b"HTTP/1.1 415"),
        ("/v1/chat/completions", "Bearer sk-wrong", b"HTTP/1.1 401"),
        ("/v1/files", "Bearer sk-wrong", b"HTTP/1.1 401"),  # (routes of their own, not the model endpoints')
        ("/v1/batches", "Bearer sk-wrong", b"HTTP/1.1 401"),
    )
    for path, auth, wanted in cases:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", stack.port), timeout=20) as sock:
            sock.sendall(head.encode() + body)  # blocked here before, until the socket's timeout
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            assert answer.startswith(wanted), answer[:200]
            assert b"connection: close" not in answer.lower()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection goes on
            rest = answer.split(b"\r\n\r\n", 1)[1]
            while b"HTTP/1.1 200" not in rest:
                piece = sock.recv(65536)
                assert piece, "the connection was closed"
                rest += piece
