"""Observability: /metrics after real calls (and no key material in it), JSON access-log lines,
/readyz ready and not ready."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import metrics
from core.config import (
    GroupLimits,
    HealthSettings,
    LimitsSettings,
    ObservabilitySettings,
    ReliabilitySettings,
    Settings,
    StoreSettings,
)
from router.app import create_app
from router.health import Readiness
from router.logs import JsonFormatter, TextFormatter
from tests.conftest import Lines, Stack, free_port, raw_request

MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="module")
def ostack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("observability")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(
            max_retries=1, backoff_base=0.01, backoff_max=0.02, breaker_threshold=10**9
        ),
        limits=LimitsSettings(groups={"limited": GroupLimits(key_rpm=1)}),
    )
    s = Stack(tmp, settings).start()
    yield s
    s.stop()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(stack: Stack) -> tuple[str, Samples]:
    response = raw_request(stack, "GET", "/metrics")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_calls_tokens_errors_retries_and_limits(ostack: Stack) -> None:
    key = ostack.key(10)
    client = ostack.client(key)
    limited_key = ostack.key(group=ostack.group(10, name="limited"))
    _, before = scrape(ostack)

    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "[delay:50] hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = iter(stream)
    next(chunks)
    _, during = scrape(ostack)
    assert value(during, "router_open_streams") >= 1  # the stream is being written
    assert sum(1 for _ in chunks) > 0
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"[flaky:1] {time.time()}"}]
    )
    limited = ostack.client(limited_key)
    limited.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "one"}])
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "two"}])
    assert raw_request(ostack, "GET", "/no/such/path").status == 404

    text, after = scrape(ostack)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    chat = "/v1/chat/completions"
    assert delta("router_requests_total", endpoint=chat, status="200") == 5
    assert delta("router_requests_total", endpoint=chat, status="429") == 1
    assert delta("router_requests_total", endpoint="unmatched", status="404") == 1
    assert delta("router_request_duration_seconds_count", endpoint=chat) == 6
    assert delta("router_request_duration_seconds_sum", endpoint=chat) > 0
    assert delta("router_calls_total", provider="openai", model=MODEL, status="ok") == 5
    assert delta("router_tokens_total", provider="openai", model=MODEL, kind="prompt") > 0
    assert delta("router_tokens_total", provider="openai", model=MODEL, kind="completion") > 0
    assert delta("router_credits_total", provider="openai", model=MODEL) > 0
    assert delta("router_time_to_first_token_seconds_count", provider="openai", model=MODEL) == 1
    assert delta("router_upstream_errors_total", provider="openai", status="503") == 1
    assert delta("router_upstream_retries_total", provider="openai") == 1
    assert delta("router_rate_limited_total", limit="key_rpm") == 1
    assert value(after, "router_open_streams") == 0
    assert value(after, "process_resident_memory_bytes") > 0

    # labels name groups and models, never keys
    for secret in (key, limited_key, hashlib.sha256(key.encode()).hexdigest(), key[-8:], "sk-mr"):
        assert secret not in text


def test_metrics_speak_openmetrics_when_asked_and_can_be_turned_off(ostack: Stack, tmp_path: Any) -> None:
    response = raw_request(
        ostack, "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/x.db"),
        observability=ObservabilitySettings(metrics=False),
    )
    paths = {getattr(route, "path", None) for route in create_app(settings).routes}
    assert "/metrics" not in paths and "/readyz" in paths


def test_access_log_is_one_json_line_per_request_without_the_key(ostack: Stack, access_lines: Lines) -> None:
    key = ostack.key(10)
    group = ostack.run(ostack.store.list_keys())[-1].group_name
    client = ostack.client(key)
    client.chat.completions.create(
        model="mistral/mistral-small-latest",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-request-id": "obs-log-1"},
    )
    entry = access_lines.find("obs-log-1")
    assert entry["logger"] == "router.access" and entry["level"] == "INFO" and entry["msg"] == "request"
    assert entry["ts"].endswith("Z")
    assert (entry["method"], entry["path"], entry["status"]) == ("POST", "/v1/chat/completions", 200)
    assert (entry["model"], entry["provider"], entry["group"]) == (
        "mistral/mistral-small-latest",
        "mistral",
        group,
    )
    assert isinstance(entry["key_id"], int) and entry["latency_ms"] > 0 and entry["stream"] is False
    bad = raw_request(
        ostack,
        "POST",
        "/v1/chat/completions",
        body=b"{}",
        headers={
            "Authorization": "Bearer sk-mr-v1-" + "x" * 43,
            "Content-Type": "application/json",
            "x-request-id": "obs-log-2",
        },
    )
    assert bad.status == 401
    entry = access_lines.find("obs-log-2")
    assert entry["status"] == 401 and entry["key_id"] is None
    everything = "\n".join(access_lines.lines)
    assert key not in everything and "x" * 43 not in everything and "Bearer" not in everything


def test_formatters_render_fields_and_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "router", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info()
        )
    record.fields = {"request_id": "r1"}
    record.provider = "openai"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "failed here" and entry["level"] == "ERROR"
    assert entry["request_id"] == "r1" and entry["provider"] == "openai"
    assert "ValueError: boom" in entry["exc"]
    text = TextFormatter().format(record)
    assert "failed here" in text and "request_id=r1" in text and "ValueError: boom" in text


def test_readyz_reports_store_and_every_upstream(ostack: Stack) -> None:
    response = raw_request(ostack, "GET", "/readyz")
    assert response.status == 200
    body = response.json()
    assert body["status"] == "ready" and body["store"]["ok"] is True
    assert set(body["upstreams"]) == {"openai", "anthropic", "google", "upstage", "mistral"}
    assert all(u["ok"] and u["address"].startswith("127.0.0.1:") for u in body["upstreams"].values())
    assert raw_request(ostack, "GET", "/healthz").status == 200


def test_readyz_is_503_when_a_provider_is_unreachable(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = free_port()
    monkeypatch.setenv("ROUTER_OPENAI_BASE_URL", f"http://127.0.0.1:{dead}/v1")  # beats the file's URL
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        health=HealthSettings(timeout=0.5, cache_seconds=30),
    )
    stack = Stack(tmp_path, settings).start()
    try:
        response = raw_request(stack, "GET", "/readyz")
        assert response.status == 503
        body = response.json()
        assert body["status"] == "not_ready" and body["store"]["ok"] is True
        assert body["upstreams"]["openai"] == {
            "ok": False,
            "address": f"127.0.0.1:{dead}",
            "error": body["upstreams"]["openai"]["error"],
        }
        assert all(u["ok"] for name, u in body["upstreams"].items() if name != "openai")
        assert raw_request(stack, "GET", "/readyz").json() == body  # cached
    finally:
        stack.stop()


async def test_readiness_fails_when_the_store_does_not_answer() -> None:
    class Broken:
        async def ping(self) -> None:
            raise OSError("database is gone")

    gateway: Any = types.SimpleNamespace(
        settings=Settings(health=HealthSettings(upstreams="none")), providers={}, started=True, store=Broken()
    )
    ready, details = await Readiness(gateway).check()
    assert not ready
    assert details == {"status": "not_ready", "store": {"ok": False, "error": "OSError: database is gone"}}


def test_retry_hook_is_callable_by_the_retry_loop() -> None:
    before = metrics.RETRIES.labels("anthropic")._value.get()
    metrics.retry("anthropic")
    assert metrics.RETRIES.labels("anthropic")._value.get() == before + 1


def test_request_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    """The call path's metrics are plain numbers exposed by a collector: a value equal to a bound
    counts in that bound's bucket (Prometheus' ``le``), and buckets add up to the count."""
    endpoint = "/test/histogram"
    for seconds in (0.001, 0.0011, 0.3, 1000.0):
        metrics.request_done(endpoint, 200, seconds)
    body, _ = metrics.exposition(None)
    samples = {}
    for line in body.decode().splitlines():
        if line.startswith("router_request_duration_seconds") and f'endpoint="{endpoint}"' in line:
            name_labels, value = line.rsplit(" ", 1)
            samples[name_labels] = float(value)
    labels = f'endpoint="{endpoint}"'
    for le, count in (("0.001", 1), ("0.0025", 2), ("0.5", 3), ("300.0", 3), ("+Inf", 4)):
        assert samples[f'router_request_duration_seconds_bucket{{{labels},le="{le}"}}'] == count, le
    assert samples[f"router_request_duration_seconds_count{{{labels}}}"] == 4
    assert abs(samples[f"router_request_duration_seconds_sum{{{labels}}}"] - 1000.3021) < 1e-9
