"""CORS (``[server] cors_origins``): browser callers of /v1/* get preflights answered and the headers
they need on every answer, streams included; nothing changes when it is off (the default)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from core.config import LimitsSettings, ReliabilitySettings, ServerSettings, Settings, StoreSettings
from tests.conftest import Stack, raw_request

APP = "https://app.example"
MODEL = "openai/gpt-4o-mini"


def _stack(tmp: Path, origins: list[str]) -> Stack:
    return Stack(
        tmp,
        Settings(
            server=ServerSettings(cors_origins=origins),
            store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
            reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
            limits=LimitsSettings(key_rpm=1000),  # so answers carry x-ratelimit-*
        ),
    ).start()


@pytest.fixture(scope="module")
def cstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = _stack(tmp_path_factory.mktemp("cors"), [APP])
    yield s
    s.stop()


def _preflight(stack: Stack, path: str, origin: str) -> dict[str, str]:
    r = raw_request(
        stack,
        "OPTIONS",
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        },
    )
    return {"status": str(r.status), **r.headers}


def test_preflight_of_the_api_only_is_answered_without_a_key(cstack: Stack) -> None:
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/models"):
        h = _preflight(cstack, path, APP)
        assert h["status"] == "200" and h["access-control-allow-origin"] == APP
        assert "POST" in h["access-control-allow-methods"]
        assert h["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    other = _preflight(cstack, "/v1/chat/completions", "https://evil.example")
    assert other["status"] == "400" and "access-control-allow-origin" not in other
    # only the API: the console and the probes stay same-origin
    assert _preflight(cstack, "/console/", APP)["status"] == "405"
    r = raw_request(cstack, "GET", "/healthz", headers={"Origin": APP})
    assert r.status == 200 and "access-control-allow-origin" not in r.headers


def test_answers_and_streams_carry_the_headers_a_browser_needs(cstack: Stack) -> None:
    client = cstack.client(cstack.key(), default_headers={"Origin": APP})
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.parse().choices[0].message.content
    assert raw.headers["access-control-allow-origin"] == APP
    exposed = {h.strip() for h in raw.headers["access-control-expose-headers"].split(",")}
    assert {
        "x-request-id",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-tokens",
        "retry-after",
    } <= exposed
    assert raw.headers["x-request-id"] and raw.headers["x-ratelimit-remaining-requests"]
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi [tokens:5]"}], stream=True
    ) as streamed:
        assert streamed.headers["access-control-allow-origin"] == APP
        assert streamed.headers["content-type"].startswith("text/event-stream")
        words = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    assert len(words.split()) == 5
    with pytest.raises(openai.AuthenticationError) as info:  # errors too, so the page can read them
        cstack.client("sk-mr-v1-" + "x" * 43, default_headers={"Origin": APP}).models.list()
    assert info.value.response.headers["access-control-allow-origin"] == APP


def test_any_origin_and_off_by_default(stack: Stack, tmp_path: Path) -> None:
    s = _stack(tmp_path, ["*"])
    try:
        assert (
            _preflight(s, "/v1/chat/completions", "https://anywhere.example")["access-control-allow-origin"]
            == "*"
        )
        raw = s.client(
            s.key(), default_headers={"Origin": "https://anywhere.example"}
        ).models.with_raw_response.list()
        assert raw.headers["access-control-allow-origin"] == "*"
    finally:
        s.stop()
    h = _preflight(stack, "/v1/chat/completions", APP)  # the shared stack: no cors_origins
    assert h["status"] == "405" and "access-control-allow-origin" not in h
    r = raw_request(
        stack, "GET", "/v1/models", headers={"Origin": APP, "Authorization": f"Bearer {stack.key()}"}
    )
    assert r.status == 200 and "access-control-allow-origin" not in r.headers
