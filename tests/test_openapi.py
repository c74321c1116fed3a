"""``GET /openapi.json`` documents every route, and schemathesis, generating valid and invalid
requests from it, gets no 5xx and only OpenAI-shaped errors from a real gateway (emulators upstream,
a real key and admin token, SQLite)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.generation.modes import GenerationMode
from starlette.routing import Mount, Route

from core.config import ConsoleSettings, ReliabilitySettings, Settings, StoreSettings
from router.openapi import OPERATIONS, document
from tests.conftest import Stack

ADMIN = "admin-token-for-the-schemathesis-run-0123456789"
schema = schemathesis.openapi.from_dict(document())
# the schema's own settings: positive and negative cases, the same ones every run (CI stays repeatable),
# no example database on disk; security headers are ours (a real key, the admin token)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    deterministic=True,
    database="none",
    with_security_parameters=False,
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    tmp: Path = tmp_path_factory.mktemp("openapi")
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        console=ConsoleSettings(admin_token=ADMIN),
    )
    stack = Stack(tmp, settings).start()
    try:
        yield stack, stack.key(credits=1_000_000)
    finally:
        stack.stop()


def _check(response: Any, anthropic: bool = False) -> None:
    """No 5xx; an error is ``{"error": {"message", "type", "param", "code"}}`` (Anthropic's Messages API:
    ``{"type": "error", "error": {"type", "message"}}``)."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400 and anthropic:
        body = json.loads(response.text)
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    elif response.status_code >= 400:
        body = json.loads(response.text)
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert "param" in error and "code" in error


def _call(case: Any, api: tuple[Stack, str]) -> None:
    stack, key = api
    token = ADMIN if case.path.startswith("/console/api") else key
    response = case.call(
        base_url=f"http://127.0.0.1:{stack.port}", headers={"Authorization": f"Bearer {token}"}, timeout=120
    )
    _check(response, case.path.startswith("/v1/messages"))


@schema.include(path_regex=r"^/v1/(chat/completions|responses)$").parametrize()
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_model_calls_answer_no_5xx_and_only_openai_errors(case: Any, api: tuple[Stack, str]) -> None:
    _call(case, api)


@schema.include(path_regex=r"^/v1/messages").parametrize()
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_messages_api_answers_no_5xx_and_only_anthropic_errors(case: Any, api: tuple[Stack, str]) -> None:
    _call(case, api)


@schema.exclude(path_regex=r"^/v1/(chat/completions|responses|messages.*)$").parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_other_operation_answers_no_5xx_and_only_openai_errors(
    case: Any, api: tuple[Stack, str]
) -> None:
    _call(case, api)


def _served(routes: list[Any], prefix: str = "") -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for route in routes:
        if isinstance(route, Mount):
            out |= _served(list(route.routes), prefix + route.path)
        elif isinstance(route, Route):
            path = (prefix + route.path).replace("{model:path}", "{model}")
            out |= {(method.lower(), path) for method in route.methods or () if method != "HEAD"}
    return out


def test_the_document_has_every_route_the_app_serves(api: tuple[Stack, str]) -> None:
    stack, _ = api
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.port}/openapi.json", timeout=5) as response:
        served_doc = json.loads(response.read())
    assert served_doc["openapi"] == "3.1.0"
    documented = {(method, path) for path, ops in served_doc["paths"].items() for method in ops}
    api_routes = {
        (m, p)
        for m, p in _served(stack.app.routes)
        if p.startswith(("/v1/", "/console/api/"))
        or p in ("/healthz", "/readyz", "/metrics", "/openapi.json")
    }
    assert api_routes - documented == set(), "routes missing from router/openapi.py OPERATIONS"
    assert documented - api_routes == set(), "documented operations the app does not serve"
    assert len(OPERATIONS) == len(documented)
