"""Traces of calls (OpenTelemetry), off unless configured by the standard variables: an exporter endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), not ``OTEL_TRACES_EXPORTER=none``
nor ``OTEL_SDK_DISABLED=true``; the SDK reads the rest (``OTEL_SERVICE_NAME``, headers, batch delays).
Off, the gateway holds None and a call pays one attribute test.

    call span       one per model call (SERVER), child of the caller's W3C ``traceparent`` when it sends one;
                    a batch line or a background response is a root of its own, linked to its batch or
                    response. GenAI semantic conventions (``gen_ai.operation.name``, ``gen_ai.provider.name``,
                    ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` /
                    ``output_tokens``, ``gen_ai.response.finish_reasons``) and ours (``router.group``,
                    ``router.key`` — the key's name, never its secret —, ``router.credits``,
                    ``router.deployment``, ``router.attempts``, ``router.cache_hit``, ``router.status``)
    attempt span    one per upstream attempt (CLIENT): retries and failovers side by side, each with its
                    deployment and status; the upstream request carries its ``traceparent``
    store spans     ``router.reserve`` and ``router.settle`` (until the settlement is durable)

Prompts and answers are never recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from billing.store import UsageRecord
    from core.deployments import Deployment
    from gateway.context import CallContext

OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "embeddings": "embeddings",
    "images": "image_generation",
}
# the GenAI conventions' names of the providers (gen_ai.provider.name)
PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "google": "gcp.gemini",
    "mistral": "mistral_ai",
    "upstage": "upstage",
}
_W3C = TraceContextTextMapPropagator()
_CURRENT: ContextVar[CallSpan | None] = ContextVar("router_call_span", default=None)


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def from_environment(environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The gateway's tracing when the environment configures it, else None."""
    if not configured(environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(
        resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or "model-router"})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider)


def _linked(kind: str, value: str) -> Link:
    """A link to the span a batch or a background response stands for: its ids drawn from its own id."""
    digest = hashlib.sha256(f"{kind}:{value}".encode()).digest()
    context = SpanContext(
        int.from_bytes(digest[:16], "big"),
        int.from_bytes(digest[16:24], "big"),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return Link(context, {f"router.{kind}": value})


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("model-router")

    def call(self, context: CallContext, model_id: str, stream: bool) -> CallSpan:
        """The span of one call (the current one from now on in this task)."""
        operation = OPERATIONS.get(context.endpoint, "chat")
        parent: Context | None = None
        links: list[Link] = []
        if context.batch_id is not None:
            links.append(_linked("batch", context.batch_id))
        elif context.response_id is not None:
            links.append(_linked("response", context.response_id))
        elif context.traceparent:
            parent = _W3C.extract({"traceparent": context.traceparent})
        span = self.tracer.start_span(
            f"{operation} {model_id}",
            context=parent or Context(),
            kind=SpanKind.SERVER,
            links=links,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.request.model": model_id,
                "router.endpoint": context.endpoint,
                "router.group": context.principal.group_name,
                "router.key": context.principal.key_name,
                "router.source": context.source,
                "router.stream": stream,
                **({"router.request_id": context.request_id} if context.request_id else {}),
            },
        )
        call = CallSpan(self, span)
        _CURRENT.set(call)
        return call

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.provider.shutdown)


def current() -> CallSpan | None:
    return _CURRENT.get()


def finish_reasons(body: Any) -> list[str]:
    """Why a non-stream answer ended, as its endpoint says it: chat's finish reasons, Anthropic's stop
    reason, a Response's status."""
    if not isinstance(body, dict):
        return []
    if isinstance(body.get("choices"), list):
        return [
            str(c.get("finish_reason"))
            for c in body["choices"]
            if isinstance(c, dict) and c.get("finish_reason")
        ]
    reason = (
        body.get("stop_reason")
        if body.get("type") == "message"
        else body.get("status")
        if body.get("object") == "response"
        else None
    )
    return [str(reason)] if reason else []


class CallSpan:
    __slots__ = ("tracing", "span", "attempts", "ended", "reasons")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span
        self.attempts = 0
        self.ended = False
        self.reasons: list[str] = []  # the answer's finish reasons, when known (non-stream)

    def _child(self, name: str, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL) -> Span:
        return self.tracing.tracer.start_span(
            name, context=trace.set_span_in_context(self.span), kind=kind, attributes=attributes
        )

    @contextmanager
    def attempt(self, deployment: Deployment, headers: dict[str, str]) -> Iterator[Span]:
        """One upstream attempt; its ``traceparent`` goes into ``headers``."""
        self.attempts += 1
        name = f"{getattr(self.span, 'name', 'chat').split(' ', 1)[0]} {deployment.prefix}"
        span = self._child(
            name,
            {
                "gen_ai.provider.name": PROVIDERS.get(deployment.prefix, deployment.prefix),
                "router.deployment": deployment.name,
                "router.attempt": self.attempts,
            },
            SpanKind.CLIENT,
        )
        _W3C.inject(headers, context=trace.set_span_in_context(span))
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, str(getattr(exc, "message", exc))[:200]))
            span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
            raise
        finally:
            span.end()

    @contextmanager
    def reserve(self, amount: int) -> Iterator[None]:
        span = self._child("router.reserve", {"router.reserved_nano": amount})
        try:
            yield
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    def finished(self, record: UsageRecord, settled: asyncio.Future[int]) -> None:
        """The call's end (its usage record filled): the span's figures, and the settlement's span until
        it is durable."""
        if self.ended:
            return
        self.ended = True
        span = self.span
        span.set_attributes(
            {
                "gen_ai.provider.name": PROVIDERS.get(record.provider, record.provider),
                "gen_ai.response.model": record.model,
                "gen_ai.usage.input_tokens": record.prompt_tokens,
                "gen_ai.usage.output_tokens": record.completion_tokens,
                "router.credits": record.credits / 1e9,
                "router.credits_nano": record.credits,
                "router.status": record.status,
                "router.deployment": record.deployment or "",
                "router.attempts": self.attempts,
                "router.cache_hit": record.cached_tokens > 0,
            }
        )
        if self.reasons:
            span.set_attribute("gen_ai.response.finish_reasons", self.reasons)
        if record.status not in ("ok",):
            span.set_status(Status(StatusCode.ERROR, record.error or record.status))
            span.set_attribute("error.type", record.error_code or record.status)
        settle = self._child("router.settle", {"router.credits_nano": record.credits})
        settled.add_done_callback(lambda done: _end_settle(settle, done))
        span.end()

    def failed(self, exc: BaseException) -> None:
        """A call that ended before anything was reserved for it (refused, or no upstream)."""
        if self.ended:
            return
        self.ended = True
        self.span.set_status(Status(StatusCode.ERROR, str(getattr(exc, "message", exc))[:200]))
        self.span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
        self.span.set_attribute("router.attempts", self.attempts)
        self.span.end()


def _end_settle(span: Span, done: asyncio.Future[int]) -> None:
    if done.cancelled() or done.exception() is not None:
        span.set_status(Status(StatusCode.ERROR, "the settlement failed"))
    span.end()
