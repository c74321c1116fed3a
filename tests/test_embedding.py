"""create_app(settings) as an ASGI sub-app mounted under a prefix inside another Starlette app."""

from __future__ import annotations

import asyncio

import openai
from hypercorn.asyncio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from billing.backends import open_store
from core.config import ServerSettings, Settings, StoreSettings
from gateway.auth import new_key
from router.app import create_app
from server.serve import hypercorn_config
from tests.conftest import Stack, free_port


async def home(request: Request) -> PlainTextResponse:
    return PlainTextResponse("host app")


def test_mounted_under_a_prefix(stack: Stack, tmp_path) -> None:
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/mounted.db"), providers=stack.settings.providers
    )
    sub = create_app(settings)
    host = Starlette(routes=[Route("/", home), Mount("/llm", app=sub)])
    port = free_port()
    stop = asyncio.Event()

    async def start() -> tuple[asyncio.Future[None], str]:
        store = open_store(settings.store.url)
        await store.open()
        await store.create_group("host", 10**12)
        key, _ = await new_key(store, settings, "host", "mounted")
        await store.close()
        config = hypercorn_config(ServerSettings(port=port))
        config.graceful_timeout = 1.0
        served = asyncio.ensure_future(serve(host, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        return served, key

    served, key = stack.run(start())
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/llm/v1", api_key=key, max_retries=0)
    try:
        out = client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        assert out.model == "openai/gpt-4o-mini" and out.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="mistral/mistral-small-latest",
                stream=True,
                messages=[{"role": "user", "content": "hi [tokens:3]"}],
            )
        )
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert any(m.id == "upstage/solar-mini" for m in client.models.list())
        try:
            client.chat.completions.create(model="nope/x", messages=[{"role": "user", "content": "hi"}])
            raise AssertionError("expected 404")
        except openai.NotFoundError:
            pass
    finally:
        client.close()

        async def finish() -> None:
            stop.set()
            await served
            assert sub.state.gateway.started  # started itself on first use
            await sub.state.gateway.stop()

        stack.run(finish())
