"""Prometheus metrics, served at ``GET /metrics`` (text format, or OpenMetrics when asked for).

We use ``prometheus_client`` (the reference client: correct exposition and escaping, content
negotiation, process metrics) with its own registry, so an application that mounts the gateway keeps
its default registry to itself. The metrics belong to the process, as Prometheus expects of a scrape
target. The metrics of every request and call are plain numbers moved on the event loop (a dict
update, a ``bisect`` per histogram: no lock, no child object), read by a custom collector at scrape
time; the rarer ones are prometheus_client metrics.

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
    router_circuit_state{provider,state}                 1 for each provider's breaker state (closed,
                                                         open, half_open), 0 for the other two
    router_deployment_calls_total{provider,deployment,outcome}   upstream attempts: ok | error | rate_limited
    router_deployment_latency_seconds{provider,deployment}       time to the upstream's answer (its headers)
    router_deployment_in_flight{provider,deployment}             this replica's calls on it now
    router_deployment_cooldowns_total{provider,deployment}       rests begun (a 429, a Retry-After)
    router_deployment_cooling{provider,deployment}               1 while it rests (as this replica knows)
    router_routing_state_errors_total                    the shared deployment state (Redis) could not be asked
    router_settlements_pending                           settlements queued and not yet durable (retries too)
    router_settlements_journaled                         settlements in the local journal, waiting for the store
    router_settlements_journaled_total                   settlements written to the journal (the store stayed down)
    router_journal_replays_total                         journaled settlements applied to the store
    router_store_errors_total{operation}                 store failures: lookup (a key) | reserve | settle | heartbeat
    router_holds_released_total{reason}                  holds released for a stopped process: dead_replica |
                                                         restart (stale_reservation_seconds)

No label ever holds key material: keys appear nowhere, groups and models only by name.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sized
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)


class _Histogram:
    """Observations per bucket (not cumulative; the last one is +Inf) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        seen = 0
        for bound, count in zip((*map(floatToGoString, self.bounds), "+Inf"), self.counts, strict=True):
            seen += count
            out.append((bound, seen))
        return out


class _Calls:
    """One (provider, model)'s settled calls."""

    __slots__ = ("prompt", "completion", "credits", "status", "ttft")

    def __init__(self) -> None:
        self.prompt = self.completion = 0
        self.credits = 0  # nano-credits (exact; credits at scrape time)
        self.status: dict[str, int] = {}
        self.ttft = _Histogram(_TTFT)


class _Level:
    """A gauge moved by +1 / -1 (``inc`` / ``dec``)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


# The per-request and per-call metrics are plain numbers, moved on the event loop's thread (no lock,
# no prometheus_client child per label set) and turned into samples when /metrics is scraped.
_requests: dict[tuple[str, int], int] = {}
_durations: dict[str, _Histogram] = {}
_calls: dict[tuple[str, str], _Calls] = {}
OPEN_STREAMS = _Level()


class _CallPath(Collector):
    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "router_requests", "HTTP requests by endpoint and status.", labels=["endpoint", "status"]
        )
        for (endpoint, status), count in list(_requests.items()):
            requests.add_metric([endpoint, str(status)], count)
        duration = HistogramMetricFamily(
            "router_request_duration_seconds",
            "HTTP request duration, until the last byte.",
            labels=["endpoint"],
        )
        for endpoint, hist in list(_durations.items()):
            duration.add_metric([endpoint], hist.buckets(), hist.total)
        calls = CounterMetricFamily(
            "router_calls",
            "Settled model calls by provider, model and outcome.",
            labels=["provider", "model", "status"],
        )
        ttft = HistogramMetricFamily(
            "router_time_to_first_token_seconds",
            "Time from the call's start to its first streamed token.",
            labels=["provider", "model"],
        )
        tokens = CounterMetricFamily(
            "router_tokens",
            "Tokens by provider, model and kind (prompt, completion).",
            labels=["provider", "model", "kind"],
        )
        credits = CounterMetricFamily(
            "router_credits", "Credits charged by provider and model.", labels=["provider", "model"]
        )
        for (provider, model), c in list(_calls.items()):
            for outcome, count in list(c.status.items()):
                calls.add_metric([provider, model, outcome], count)
            if any(c.ttft.counts):
                ttft.add_metric([provider, model], c.ttft.buckets(), c.ttft.total)
            tokens.add_metric([provider, model, "prompt"], c.prompt)
            tokens.add_metric([provider, model, "completion"], c.completion)
            credits.add_metric([provider, model], c.credits / 1e9)
        streams = GaugeMetricFamily(
            "router_open_streams", "SSE responses being written now.", value=OPEN_STREAMS.value
        )
        yield from (requests, duration, streams, calls, ttft, tokens, credits)


REGISTRY.register(_CallPath())


class Circuits(Protocol):
    """What the circuit state metric reads (gateway.reliability.Breakers)."""

    def states(self) -> Mapping[str, str]: ...


_circuits: weakref.WeakSet[Any] = weakref.WeakSet()
CIRCUIT_STATES = ("closed", "half_open", "open")  # from best to worst


def watch_circuits(source: Circuits) -> None:
    """Report ``source``'s breaker states at every scrape (for as long as it lives)."""
    _circuits.add(source)


class _CircuitState(Collector):
    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "router_circuit_state",
            "Circuit breaker state per provider (1 = current).",
            labels=["provider", "state"],
        )
        states: dict[str, str] = {}  # several gateways in one process (tests, mounts): the worst state
        for source in list(_circuits):
            for provider, state in source.states().items():
                state = state.replace("-", "_")
                if CIRCUIT_STATES.index(state) > CIRCUIT_STATES.index(states.get(provider, "closed")):
                    states[provider] = state
                states.setdefault(provider, state)
        for provider, current in sorted(states.items()):
            for name in CIRCUIT_STATES:
                family.add_metric([provider, name], 1.0 if name == current else 0.0)
        yield family


REGISTRY.register(_CircuitState())

UPSTREAM_ERRORS = Counter(
    "router_upstream_errors",
    "Failed upstream attempts by provider and HTTP status (or connect, timeout, network).",
    ["provider", "status"],
    registry=REGISTRY,
)
RETRIES = Counter("router_upstream_retries", "Upstream retries by provider.", ["provider"], registry=REGISTRY)
REFUSALS_UNRECORDED = Counter(
    "router_refusals_unrecorded",
    "Refused calls left without a usage record of their own (a flood past 10 a second per group and code: "
    "gateway/refusals.py), by error code.",
    ["code"],
)
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

# cached children of the rarer metrics: nested dicts keyed by the label values
_upstream: dict[str, dict[int | str, Any]] = {}
_retries: dict[str, Any] = {}
_limited: dict[str, Any] = {}


def request_done(endpoint: str, status: int, seconds: float) -> None:
    """One HTTP request finished (the observing middleware)."""
    key = (endpoint, status)
    _requests[key] = _requests.get(key, 0) + 1
    hist = _durations.get(endpoint)
    if hist is None:
        hist = _durations[endpoint] = _Histogram(_LATENCY)
    hist.observe(seconds)


class Settled(Protocol):
    """What :func:`call_settled` reads of a usage record (billing.store.UsageRecord)."""

    provider: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    credits: int
    status: str
    ttft_ms: float | None


def call_settled(record: Settled) -> None:
    """One call's usage record is complete (``Meter.finish``): tokens, credits, outcome, TTFT."""
    key = (record.provider, record.model)
    c = _calls.get(key)
    if c is None:
        c = _calls[key] = _Calls()
    c.prompt += record.prompt_tokens
    c.completion += record.completion_tokens
    c.credits += record.credits
    c.status[record.status] = c.status.get(record.status, 0) + 1
    if record.ttft_ms is not None:
        c.ttft.observe(record.ttft_ms / 1000)


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


def refusal_unrecorded(code: str) -> None:
    REFUSALS_UNRECORDED.labels(code).inc()


def ratelimit_backend_error() -> None:
    RATELIMIT_ERRORS.inc()


def exposition(accept: str | None) -> tuple[bytes, str]:
    """The registry in the format the scraper asked for: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(REGISTRY), content_type


class _Deployment:
    """One deployment's attempts, latency, calls in flight and cooldowns."""

    __slots__ = ("outcomes", "latency", "in_flight", "cooldowns")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.latency = _Histogram(_LATENCY)
        self.in_flight = 0
        self.cooldowns = 0


_deployments: dict[tuple[str, str], _Deployment] = {}
_resting: weakref.WeakSet[Any] = weakref.WeakSet()


class Resting(Protocol):
    """What the cooling gauge reads (gateway.dispatch.Dispatcher): (provider, deployment) -> seconds."""

    def resting(self) -> Mapping[tuple[str, str], float]: ...


def _deployment(provider: str, name: str) -> _Deployment:
    d = _deployments.get((provider, name))
    if d is None:
        d = _deployments[(provider, name)] = _Deployment()
    return d


def deployment_call(provider: str, name: str, outcome: str, seconds: float | None = None) -> None:
    """An upstream attempt on a deployment ended: ``ok`` (its answer came after ``seconds``),
    ``error`` or ``rate_limited``."""
    d = _deployment(provider, name)
    d.outcomes[outcome] = d.outcomes.get(outcome, 0) + 1
    if seconds is not None:
        d.latency.observe(seconds)


def deployment_flight(provider: str, name: str, delta: int) -> None:
    _deployment(provider, name).in_flight += delta


def deployment_cooldown(provider: str, name: str) -> None:
    _deployment(provider, name).cooldowns += 1


def watch_deployments(source: Resting) -> None:
    """Report ``source``'s resting deployments at every scrape (for as long as it lives)."""
    _resting.add(source)


class _Deployments(Collector):
    def collect(self) -> Iterator[Metric]:
        labels = ["provider", "deployment"]
        calls = CounterMetricFamily(
            "router_deployment_calls",
            "Upstream attempts by deployment and outcome.",
            labels=[*labels, "outcome"],
        )
        latency = HistogramMetricFamily(
            "router_deployment_latency_seconds",
            "Time from sending to a deployment to its answer's headers.",
            labels=labels,
        )
        flight = GaugeMetricFamily(
            "router_deployment_in_flight", "Calls on a deployment now (this replica).", labels=labels
        )
        cooldowns = CounterMetricFamily(
            "router_deployment_cooldowns", "Rests a deployment began.", labels=labels
        )
        cooling = GaugeMetricFamily("router_deployment_cooling", "1 while a deployment rests.", labels=labels)
        for (provider, name), d in list(_deployments.items()):
            for outcome, count in list(d.outcomes.items()):
                calls.add_metric([provider, name, outcome], count)
            if any(d.latency.counts):
                latency.add_metric([provider, name], d.latency.buckets(), d.latency.total)
            flight.add_metric([provider, name], d.in_flight)
            cooldowns.add_metric([provider, name], d.cooldowns)
        resting: dict[tuple[str, str], float] = {}
        for source in list(_resting):
            for key, seconds in source.resting().items():
                resting[key] = max(resting.get(key, 0.0), seconds)
        for (provider, name), seconds in sorted(resting.items()):
            cooling.add_metric([provider, name], 1.0 if seconds > 0 else 0.0)
        yield from (calls, latency, flight, cooldowns, cooling)


REGISTRY.register(_Deployments())

ROUTING_ERRORS = Counter(
    "router_routing_state_errors",
    "Deployment state checks that could not reach their store (Redis).",
    registry=REGISTRY,
)


def routing_state_error() -> None:
    ROUTING_ERRORS.inc()


class ConnectionCounts(Protocol):
    """What the connection metrics read (server.connections.Limits)."""

    @property
    def open(self) -> Sized: ...
    @property
    def idle(self) -> Sized: ...
    @property
    def evicted(self) -> int: ...
    @property
    def refused(self) -> int: ...
    @property
    def max_connections(self) -> int: ...


_connections: list[ConnectionCounts] = []


def watch_connections(source: ConnectionCounts) -> None:
    """Report the process's client connections (the last caps installed) at every scrape."""
    _connections[:] = [source]


class _Connections(Collector):
    def collect(self) -> Iterator[Metric]:
        if not _connections:
            return
        source = _connections[0]
        yield GaugeMetricFamily(
            "router_connections_open", "Client connections open now.", value=len(source.open)
        )
        yield GaugeMetricFamily(
            "router_connections_idle",
            "Client connections open with no request in flight.",
            value=len(source.idle),
        )
        yield GaugeMetricFamily(
            "router_connections_max", "The cap on open client connections.", value=source.max_connections
        )
        yield CounterMetricFamily(
            "router_connections_evicted",
            "Idle connections closed to make room for new ones.",
            value=source.evicted,
        )
        yield CounterMetricFamily(
            "router_connections_refused",
            "Connections answered 503 because every open one was busy.",
            value=source.refused,
        )


REGISTRY.register(_Connections())


# -- the ledger under faults (billing/durable.py, billing/leases.py) ----------------------------------------
_ledgers: weakref.WeakSet[Any] = weakref.WeakSet()
_journals: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_ledger(ledger: Any) -> None:
    """Report ``len(ledger.pending)`` at every scrape (for as long as it lives)."""
    _ledgers.add(ledger)


def watch_journal(journal: Any) -> None:
    """Report ``journal.count`` at every scrape (for as long as it lives)."""
    _journals.add(journal)


class _Settlements(Collector):
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "router_settlements_pending",
            "Settlements queued and not yet durable.",
            value=sum(len(ledger.pending) for ledger in list(_ledgers)),
        )
        yield GaugeMetricFamily(
            "router_settlements_journaled",
            "Settlements in the local journal, waiting for the store.",
            value=sum(journal.count for journal in list(_journals)),
        )


REGISTRY.register(_Settlements())
JOURNALED = Counter(
    "router_settlements_journaled",
    "Settlements written to the local journal because the store stayed down.",
    registry=REGISTRY,
)
REPLAYED = Counter("router_journal_replays", "Journaled settlements applied to the store.", registry=REGISTRY)
STORE_ERRORS = Counter(
    "router_store_errors",
    "Store failures by operation (lookup, reserve, settle, heartbeat).",
    ["operation"],
    registry=REGISTRY,
)
HOLDS_RELEASED = Counter(
    "router_holds_released",
    "Holds released for a stopped process, by reason (dead_replica, restart).",
    ["reason"],
    registry=REGISTRY,
)


def store_error(operation: str) -> None:
    STORE_ERRORS.labels(operation).inc()


def settlements_journaled(count: int) -> None:
    JOURNALED.inc(count)


def journal_replayed(count: int) -> None:
    REPLAYED.inc(count)


def holds_released(reason: str, count: int) -> None:
    HOLDS_RELEASED.labels(reason).inc(count)
