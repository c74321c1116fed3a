"""``router.middleware.Front``, the outermost ASGI layer, on its own: plain ASGI apps inside it, the
ASGI messages it sends recorded. What it promises: a request id on every answer (the caller's if it is
sane), the fast endpoints called for POST only, their errors answered before anything was sent and
re-raised after, one access-log line and one metrics count per request, open streams counted while
they are written. The whole app behind it is tested through a real server everywhere else."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from core import metrics
from core.errors import GatewayError, InvalidRequest
from core.types import ASGIApp, Message, Receive, Scope, Send
from router import logs
from router.middleware import Front

Sent = list[Message]


def answering(status: int = 200, content_type: bytes = b"application/json", body: bytes = b"{}") -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]}
        )
        await send({"type": "http.response.body", "body": body})

    return app


def failing(exc: BaseException, after_start: bool = False) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if after_start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise exc

    return app


def error_answer(exc: Exception, scope: Scope) -> ASGIApp:
    status = exc.status if isinstance(exc, GatewayError) else 500
    return answering(status, body=exc.render() if isinstance(exc, GatewayError) else b'{"error":{}}')


def call(
    front: Front,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    headers: list[tuple[bytes, bytes]] | None = None,
    root_path: str = "",
) -> tuple[Scope, Sent]:
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "headers": headers or [],
        "client": ("10.0.0.5", 5000),
    }
    sent: Sent = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(front(scope, receive, send))
    return scope, sent


def header(sent: Sent, name: bytes) -> bytes | None:
    start = next(m for m in sent if m["type"] == "http.response.start")
    return next((v for k, v in start["headers"] if k == name), None)


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.__dict__["fields"])

    handler, level = Keep(), logs.ACCESS.level
    logs.ACCESS.addHandler(handler)
    logs.ACCESS.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logs.ACCESS.removeHandler(handler)
        logs.ACCESS.setLevel(level)


def requests_counted(endpoint: str, status: int) -> float:
    text = metrics.exposition(None)[0].decode()
    found = re.search(
        rf'router_requests_total{{endpoint="{re.escape(endpoint)}",status="{status}"}} (\S+)', text
    )
    return float(found.group(1)) if found else 0.0


def test_a_sane_request_id_is_kept_and_others_are_replaced() -> None:
    front = Front(answering())
    scope, sent = call(front, "GET", "/v1/models", [(b"x-request-id", b"trace-42:a.b")])
    assert header(sent, b"x-request-id") == b"trace-42:a.b"
    assert logs.trace_of(scope).request_id == "trace-42:a.b"  # what the endpoints and the access log see
    for bad in (b"has space", b"x" * 129, b"\xc3\xa9"):
        _, sent = call(front, "GET", "/v1/models", [(b"x-request-id", bad)])
        assert re.fullmatch(rb"req_[0-9a-f]{24}", header(sent, b"x-request-id") or b"")
    _, first = call(front, "GET", "/v1/models")
    _, second = call(front, "GET", "/v1/models")
    assert header(first, b"x-request-id") != header(second, b"x-request-id")


def test_fast_endpoints_answer_post_only_and_see_the_path_below_the_mount() -> None:
    seen: list[str] = []

    def named(name: str) -> ASGIApp:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(name)
            await answering()(scope, receive, send)

        return app

    front = Front(named("app"), fast={"/v1/chat/completions": named("fast")})
    call(front, "POST", "/v1/chat/completions")
    call(front, "GET", "/v1/chat/completions")  # the app answers it (405 in the real one)
    call(front, "POST", "/v1/chat/completions", root_path="/llm")  # mounted under /llm
    call(front, "POST", "/v1/chat/completionsx")
    assert seen == ["fast", "app", "fast", "app"]


def test_a_fast_endpoints_error_is_answered_before_the_start_and_reraised_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    front = Front(
        answering(),
        fast={"/v1/chat/completions": failing(InvalidRequest("bad", param="model"))},
        on_error=error_answer,
    )
    _, sent = call(front)
    assert sent[0]["status"] == 400 and b'"param":"model"' in sent[1]["body"]
    assert header(sent, b"x-request-id") is not None  # error answers carry the id too
    crash = Front(
        answering(), fast={"/v1/chat/completions": failing(KeyError("boom"))}, on_error=error_answer
    )
    with caplog.at_level(logging.ERROR, logger="router"):
        _, sent = call(crash)
    assert sent[0]["status"] == 500 and "unhandled error on /v1/chat/completions" in caplog.text
    late = Front(
        answering(),
        fast={"/v1/chat/completions": failing(InvalidRequest("late"), after_start=True)},
        on_error=error_answer,
    )
    with pytest.raises(InvalidRequest):
        call(late)  # the answer had begun: the server drops the connection


def test_one_access_line_per_request_with_what_the_endpoint_learnt(
    access_lines: list[dict[str, Any]],
) -> None:
    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        trace = logs.trace_of(scope)
        trace.model, trace.provider = "claude/claude-haiku-4-5", "anthropic"
        await answering()(scope, receive, send)

    call(Front(answering(), fast={"/v1/chat/completions": endpoint}), headers=[(b"x-request-id", b"r-1")])
    [line] = access_lines
    assert {
        k: line[k]
        for k in ("method", "path", "status", "request_id", "model", "provider", "stream", "client")
    } == {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "request_id": "r-1",
        "model": "claude/claude-haiku-4-5",
        "provider": "anthropic",
        "stream": False,
        "client": "10.0.0.5",
    }
    assert line["group"] is None and line["key_id"] is None and line["latency_ms"] >= 0


def routed(status: int = 200) -> ASGIApp:
    """An app whose router matched the request's path (as Starlette's sets ``scope["route"]``)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = Route(scope["path"], answering(status))
        await answering(status)(scope, receive, send)

    return app


def test_probes_are_not_logged_unless_they_fail_and_the_log_can_be_off(
    access_lines: list[dict[str, Any]],
) -> None:
    call(Front(routed()), "GET", "/healthz")
    assert access_lines == []
    call(Front(routed(503)), "GET", "/readyz")
    assert [line["status"] for line in access_lines] == [503]
    call(Front(answering(), access_log=False), "GET", "/v1/models")
    assert len(access_lines) == 1


def test_a_caller_gone_while_sending_its_body_is_a_499(access_lines: list[dict[str, Any]]) -> None:
    front = Front(
        answering(), fast={"/v1/chat/completions": failing(ClientDisconnect())}, on_error=error_answer
    )
    _, sent = call(front)
    assert sent == [] and [line["status"] for line in access_lines] == [499]
    before = requests_counted("/v1/chat/completions", 499)
    with pytest.raises(asyncio.CancelledError):  # the caller went away while we were answering
        call(Front(answering(), fast={"/v1/chat/completions": failing(asyncio.CancelledError())}))
    assert requests_counted("/v1/chat/completions", 499) == before + 1
    assert access_lines[-1]["status"] == 499


def test_each_request_is_counted_under_its_endpoint() -> None:
    counts = ("/v1/chat/completions", 200), ("unmatched", 404), ("/v1/models", 200)
    before = [requests_counted(*c) for c in counts]
    call(Front(answering(), fast={"/v1/chat/completions": answering()}))
    call(Front(answering(404)), "GET", "/nowhere")  # no route matched it
    call(Front(routed()), "GET", "/v1/models")
    assert [requests_counted(*c) for c in counts] == [n + 1 for n in before]


def test_a_stream_counts_as_open_while_it_is_written(access_lines: list[dict[str, Any]]) -> None:
    during: list[int] = []

    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        during.append(metrics.OPEN_STREAMS.value)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    before = metrics.OPEN_STREAMS.value
    call(Front(answering(), fast={"/v1/chat/completions": stream}))
    assert during == [before + 1] and metrics.OPEN_STREAMS.value == before
    assert access_lines[-1]["stream"] is True
    with pytest.raises(RuntimeError):  # a stream that breaks is no longer open either
        call(Front(answering(), fast={"/v1/chat/completions": _breaks_mid_stream}))
    assert metrics.OPEN_STREAMS.value == before


async def _breaks_mid_stream(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    raise RuntimeError("upstream read failed")
