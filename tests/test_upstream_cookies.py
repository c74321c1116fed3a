"""The gateway keeps no upstream cookies. Every tenant's calls to a provider share one HTTP session;
with a cookie jar, a cookie the provider sets on one tenant's answer (real ones do: Cloudflare's
``__cf_bm`` in front of api.openai.com) would be sent back with every other tenant's calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from core.config import Settings, parse_settings
from emulators.openai import OpenAIEmulator
from tests.conftest import Stack


class CookieSettingEmulator(OpenAIEmulator):
    """The OpenAI emulator, setting a cookie on every answer and noting the Cookie header of every
    request it gets."""

    def __init__(self) -> None:
        super().__init__("openai", "key-cookies")
        self.cookies: list[str | None] = []
        self.app.on_response_prepare.append(self._prepare)

    async def _prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        self.cookies.append(request.headers.get("Cookie"))
        response.headers["Set-Cookie"] = f"__cf_bm=tenant-{len(self.cookies)}; Path=/; HttpOnly"


def host_named(url: str) -> str:
    """``url`` by host name: aiohttp's cookie jar ignores cookies from IP addresses, a provider has a
    name."""
    return url.replace("127.0.0.1", "localhost")


def test_a_cookie_set_on_one_tenants_answer_is_not_sent_with_anothers_call(tmp_path: Path) -> None:
    upstream = CookieSettingEmulator()

    def build(urls: dict[str, str]) -> Settings:
        raw: dict[str, Any] = {
            "store": {"url": f"sqlite:///{tmp_path}/router.db"},
            "reliability": {"max_retries": 0, "breaker_threshold": 10**9},
            "providers": {
                "openai": {
                    "deployments": [  # (a group with deployments keeps its own addresses)
                        {
                            "name": "cookies",
                            "base_url": host_named(urls["cookies"]) + "/v1",
                            "api_key": "key-cookies",
                        }
                    ]
                }
            },
        }
        return parse_settings(raw, "test")

    stack = Stack(tmp_path, extra={"cookies": upstream}, configure=build).start()  # type: ignore[dict-item]
    try:
        first, second = stack.client(stack.key()), stack.client(stack.key())  # two groups
        for client in (first, second, first, second):
            answer = client.chat.completions.with_raw_response.create(
                model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=2
            )
            assert answer.http_response.status_code == 200
            assert "set-cookie" not in answer.http_response.headers  # not relayed to the caller either
        stream = second.chat.completions.create(
            model="openai/gpt-4o-mini",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=2,
            stream=True,
        )
        assert [chunk for chunk in stream]
        assert len(upstream.cookies) == 5 and upstream.cookies == [None] * 5
    finally:
        stack.close_clients()
        stack.stop()
