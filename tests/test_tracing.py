"""OpenTelemetry traces of calls, exported over OTLP/HTTP to a real receiver on loopback (an aiohttp app
that decodes what arrives with the ``opentelemetry-proto`` messages), configured by the standard
``OTEL_*`` variables: a call's span with the GenAI conventions and ours, a child per upstream attempt
(a retried call shows both), the store's reserve and settle, the caller's ``traceparent`` as the parent
and sent upstream, a stream; no prompt or answer text anywhere. Off, nothing is exported."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from core.config import ReliabilitySettings, Settings, StoreSettings
from emulators.common import serve
from gateway.tracing import configured
from tests.conftest import Stack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, as (name, attributes, span)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self.traces)

    async def traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def named(self, prefix: str) -> list[Any]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        kind = value.WhichOneof("value")
        out[item.key] = (
            list(v.string_value for v in value.array_value.values)
            if kind == "array_value"
            else getattr(value, kind)
        )
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Receiver]]:
    receiver = Receiver()
    loop = asyncio.new_event_loop()
    runner, port = loop.run_until_complete(serve(receiver.app, "127.0.0.1", 0))
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "router-under-test",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        tmp: Path = tmp_path_factory.mktemp("traced")
        settings = Settings(
            store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
            reliability=ReliabilitySettings(max_retries=2, backoff_base=0.01, breaker_threshold=10**9),
        )
        stack = Stack(tmp, settings).start()
    try:
        yield stack, receiver
    finally:
        stack.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def flushed(stack: Stack, receiver: Receiver, count: int, prefix: str) -> list[Any]:
    stack.run(stack.gateway.ledger.drain())
    stack.gateway.tracing.provider.force_flush(5000)
    deadline = time.monotonic() + 5
    while len(receiver.named(prefix)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return receiver.named(prefix)


def test_a_call_and_a_stream_are_traced_with_the_genai_conventions(traced: tuple[Stack, Receiver]) -> None:
    stack, receiver = traced
    group = stack.group(10, name="traced-group")
    client = stack.client(stack.key(group=group, name="ci-key"))
    secret = "the secret prompt text"
    client.chat.completions.create(
        model="anthropic/claude-haiku-4-5",
        messages=[{"role": "user", "content": secret}],
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT}-01"},
    )
    list(
        client.chat.completions.create(
            model="google/gemini-2.5-flash", stream=True, messages=[{"role": "user", "content": "stream it"}]
        )
    )
    calls = flushed(stack, receiver, 2, "chat ")
    claude = next(
        s for s in calls if attributes(s).get("gen_ai.request.model") == "anthropic/claude-haiku-4-5"
    )
    a = attributes(claude)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.response.model"] == "anthropic/claude-haiku-4-5" and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] > 0 and a["gen_ai.response.finish_reasons"] == ["stop"]
    assert (
        a["router.group"] == "traced-group" and a["router.key"] == "ci-key" and a["router.credits_nano"] > 0
    )
    assert a["router.attempts"] == 1 and a["router.status"] == "ok" and a["router.cache_hit"] is False
    assert claude.trace_id.hex() == TRACE_ID and claude.parent_span_id.hex() == PARENT  # the caller's trace
    attempt = next(s for s in receiver.named("chat anthropic") if s.parent_span_id == claude.span_id)
    sent = stack.emulator("anthropic").headers[-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{attempt.span_id.hex()}-01"  # the upstream joins the trace
    assert {s.name for s in receiver.spans if s.parent_span_id == claude.span_id} >= {
        "router.reserve",
        "router.settle",
    }
    gemini = next(s for s in calls if attributes(s).get("gen_ai.request.model") == "google/gemini-2.5-flash")
    assert (
        attributes(gemini)["router.stream"] is True
        and attributes(gemini)["gen_ai.provider.name"] == "gcp.gemini"
    )
    assert attributes(gemini)["gen_ai.usage.output_tokens"] > 0
    assert not any(
        secret in str(attributes(s)) or secret in s.name for s in receiver.spans
    )  # no prompt recorded


def test_a_retried_call_shows_each_attempt(traced: tuple[Stack, Receiver]) -> None:
    stack, receiver = traced
    client = stack.client()
    client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "once [flaky:1]"}]
    )
    calls = flushed(stack, receiver, 3, "chat ")
    call = next(s for s in calls if attributes(s).get("gen_ai.request.model") == "openai/gpt-4o-mini")
    attempts = sorted(
        (s for s in receiver.named("chat openai") if s.parent_span_id == call.span_id),
        key=lambda s: s.start_time_unix_nano,
    )
    assert [attributes(s)["router.attempt"] for s in attempts] == [1, 2] and attributes(call)[
        "router.attempts"
    ] == 2
    assert attempts[0].status.code == 2 and attributes(attempts[0])["error.type"] == "upstream_unavailable"
    assert attributes(attempts[1])["http.response.status_code"] == 200


def test_a_refused_call_ends_its_span_with_the_error(traced: tuple[Stack, Receiver]) -> None:
    stack, receiver = traced
    with pytest.raises(openai.NotFoundError):
        stack.client().chat.completions.create(
            model="openai/no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    (span,) = flushed(stack, receiver, 1, "chat openai/no-such-model")
    assert span.status.code == 2 and attributes(span)["error.type"] == "model_not_found"


def test_off_unless_the_environment_configures_an_exporter() -> None:
    assert not configured({})
    assert configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert not configured(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_SDK_DISABLED": "true"}
    )


def test_the_shared_stack_exports_nothing(stack: Stack) -> None:
    assert stack.gateway.tracing is None
