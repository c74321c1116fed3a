"""Prometheus metrics, served at ``GET /metrics`` (text format, or OpenMetrics when asked for).

We use ``prometheus_client`` (the reference client: correct exposition and escaping, content
negotiation, process metrics) with its own registry, so an application that mounts the gateway keeps
its default registry to itself. The metrics belong to the process, as Prometheus expects of a scrape
target. Hot-path cost is one dict lookup per labelled child (children are cached here, so no label
tuple or dict is built per request) plus prometheus_client's increment under a lock.

    router_requests_total{endpoint,status}              HTTP requests (endpoint = route template)
    router_request_duration_seconds{endpoint}           until the last byte (streams included)
    router_open_streams                                  SSE responses being written now
    router_calls_total{provider,model,status}            settled calls: ok | error | interrupted
    router_time_to_first_token_seconds{provider,model}  streams
    router_tokens_total{provider,model,kind}             kind = prompt | completion
    router_credits_total{provider,model}                 credits charged
    router_upstream_errors_total{provider,status}        HTTP status >= 400, or connect | timeout | network
    router_upstream_retries_total{provider}              :func:`retry`, called by the retry loop
    router_rate_limited_total{limit}                     refused calls: key_rpm, key_tpm, group_rpm, group_tpm
    router_ratelimit_backend_errors_total                the rate limit store could not be asked

No label ever holds key material: keys appear nowhere, groups and models only by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector
from starlette.requests import Request
from starlette.responses import Response

from adapters.transport import Transport
from router.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable

if TYPE_CHECKING:
    import aiohttp

    from adapters.base import UpstreamRequest
    from billing.store import UsageRecord
    from router.config import ResolvedProvider

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)

REQUESTS = Counter(
    "router_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"], registry=REGISTRY
)
DURATION = Histogram(
    "router_request_duration_seconds",
    "HTTP request duration, until the last byte.",
    ["endpoint"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
OPEN_STREAMS = Gauge("router_open_streams", "SSE responses being written now.", registry=REGISTRY)
CALLS = Counter(
    "router_calls",
    "Settled model calls by provider, model and outcome.",
    ["provider", "model", "status"],
    registry=REGISTRY,
)
TTFT = Histogram(
    "router_time_to_first_token_seconds",
    "Time from the call's start to its first streamed token.",
    ["provider", "model"],
    buckets=_TTFT,
    registry=REGISTRY,
)
TOKENS = Counter(
    "router_tokens",
    "Tokens by provider, model and kind (prompt, completion).",
    ["provider", "model", "kind"],
    registry=REGISTRY,
)
CREDITS = Counter(
    "router_credits", "Credits charged by provider and model.", ["provider", "model"], registry=REGISTRY
)
UPSTREAM_ERRORS = Counter(
    "router_upstream_errors",
    "Failed upstream attempts by provider and HTTP status (or connect, timeout, network).",
    ["provider", "status"],
    registry=REGISTRY,
)
RETRIES = Counter("router_upstream_retries", "Upstream retries by provider.", ["provider"], registry=REGISTRY)
RATE_LIMITED = Counter(
    "router_rate_limited",
    "Calls refused by the gateway's rate limits, by the limit that refused.",
    ["limit"],
    registry=REGISTRY,
)
RATELIMIT_ERRORS = Counter(
    "router_ratelimit_backend_errors",
    "Rate limit checks that could not reach their store.",
    registry=REGISTRY,
)

# cached children: nested dicts keyed by the label values, so the hot path allocates nothing
_requests: dict[str, dict[int, tuple[Any, Any]]] = {}
_calls: dict[str, dict[str, _CallChildren]] = {}
_upstream: dict[str, dict[int | str, Any]] = {}
_retries: dict[str, Any] = {}
_limited: dict[str, Any] = {}


class _CallChildren:
    __slots__ = ("prompt", "completion", "credits", "ttft", "status")

    def __init__(self, provider: str, model: str) -> None:
        self.prompt = TOKENS.labels(provider, model, "prompt")
        self.completion = TOKENS.labels(provider, model, "completion")
        self.credits = CREDITS.labels(provider, model)
        self.ttft = TTFT.labels(provider, model)
        self.status = {s: CALLS.labels(provider, model, s) for s in ("ok", "error", "interrupted")}


def request_done(endpoint: str, status: int, seconds: float) -> None:
    """One HTTP request finished (the observing middleware)."""
    by_status = _requests.get(endpoint)
    if by_status is None:
        by_status = _requests[endpoint] = {}
    children = by_status.get(status)
    if children is None:
        children = by_status[status] = (REQUESTS.labels(endpoint, str(status)), DURATION.labels(endpoint))
    children[0].inc()
    children[1].observe(seconds)


def call_settled(record: UsageRecord) -> None:
    """One call's usage record is complete (``Meter.finish``): tokens, credits, outcome, TTFT."""
    by_model = _calls.get(record.provider)
    if by_model is None:
        by_model = _calls[record.provider] = {}
    c = by_model.get(record.model)
    if c is None:
        c = by_model[record.model] = _CallChildren(record.provider, record.model)
    if record.prompt_tokens:
        c.prompt.inc(record.prompt_tokens)
    if record.completion_tokens:
        c.completion.inc(record.completion_tokens)
    if record.credits:
        c.credits.inc(record.credits / 1e9)
    if record.ttft_ms is not None:
        c.ttft.observe(record.ttft_ms / 1000)
    status = c.status.get(record.status)
    if status is None:
        status = c.status[record.status] = CALLS.labels(record.provider, record.model, record.status)
    status.inc()


def upstream_error(provider: str, status: int | str) -> None:
    """An upstream attempt failed: its HTTP status, or ``connect`` / ``timeout`` / ``network``."""
    by_status = _upstream.get(provider)
    if by_status is None:
        by_status = _upstream[provider] = {}
    child = by_status.get(status)
    if child is None:
        child = by_status[status] = UPSTREAM_ERRORS.labels(provider, str(status))
    child.inc()


def retry(provider: str) -> None:
    """The retry loop is about to try ``provider`` again."""
    child = _retries.get(provider)
    if child is None:
        child = _retries[provider] = RETRIES.labels(provider)
    child.inc()


def rate_limited(limit: str) -> None:
    child = _limited.get(limit)
    if child is None:
        child = _limited[limit] = RATE_LIMITED.labels(limit)
    child.inc()


def ratelimit_backend_error() -> None:
    RATELIMIT_ERRORS.inc()


def exposition(accept: str | None) -> tuple[bytes, str]:
    """The registry in the format the scraper asked for: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(REGISTRY), content_type


class ObservedTransport(Transport):
    """The shared transport, counting failed upstream attempts (every attempt, retries included)."""

    async def open(
        self, request: UpstreamRequest, provider: ResolvedProvider, *args: Any, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        try:
            response = await super().open(request, provider, *args, **kwargs)
        except UpstreamTimeout:
            upstream_error(provider.prefix, "timeout")
            raise
        except UpstreamUnavailable:
            upstream_error(provider.prefix, "connect")
            raise
        except GatewayError:
            upstream_error(provider.prefix, "network")
            raise
        if response.status >= 400:
            upstream_error(provider.prefix, response.status)
        return response


async def endpoint(request: Request) -> Response:
    """``GET /metrics``."""
    body, content_type = exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)
