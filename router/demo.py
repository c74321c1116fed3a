"""``router demo``: the emulated providers and the gateway in one process, with a seeded key.

Data lives in the default store under the working directory, so ``router keys ...`` and ``router
groups ...`` run from the same directory act on the demo's group and keys.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from billing.store import Store, open_store
from core.catalog import NANO
from core.config import ProviderSettings, Settings
from emulators.registry import start_emulators, stop_emulators
from gateway.auth import hash_key, new_key
from router.app import create_app
from router.serve import serve

DEMO_GROUP = "demo"
DEMO_CREDITS = 1_000 * NANO


def with_emulators(settings: Settings, running: dict) -> Settings:
    providers = dict(settings.providers)
    for prefix, item in running.items():
        providers[prefix] = ProviderSettings(base_url=item.base_url, api_key=item.api_key)
    return msgspec.structs.replace(settings, providers=providers)


async def seed(store: Store, settings: Settings) -> str:
    """The demo group and a key; ``ROUTER_DEMO_KEY`` fixes the key's value (reused if present)."""
    if await store.get_group(DEMO_GROUP) is None:
        await store.create_group(DEMO_GROUP, DEMO_CREDITS)
    fixed = os.environ.get("ROUTER_DEMO_KEY")
    if fixed and await store.principal(hash_key(fixed)) is not None:
        return fixed
    key, _ = await new_key(store, settings, DEMO_GROUP, "demo", key=fixed or None)
    return key


async def demo(settings: Settings, host: str, port: int) -> None:
    running = await start_emulators(host)
    settings = with_emulators(settings, running)
    store = open_store(settings.store.url)
    await store.open()
    key = await seed(store, settings)
    await store.close()
    app = create_app(settings)
    base = f"http://{host}:{port}/v1"

    async def banner() -> None:
        print(
            f"""
  Model router demo: gateway on {base}, emulated providers: {", ".join(sorted(running))}
  API key (group '{DEMO_GROUP}'):
    {key}

  Try it:
    curl {base}/chat/completions -H "Authorization: Bearer {key}" \\
         -H "Content-Type: application/json" \\
         -d '{{"model": "openai/gpt-4o-mini", "messages": [{{"role": "user", "content": "Hello"}}]}}'

    python -c "from openai import OpenAI; c = OpenAI(base_url='{base}', api_key='{key}'); \\
print(c.chat.completions.create(model='mistral/mistral-small-latest', messages=[{{'role': 'user', 'content': 'Hi'}}]).choices[0].message.content)"
  Ctrl-C stops it.
""",
            flush=True,
        )

    try:
        await serve(app, host, port, started=banner)
    finally:
        await stop_emulators(running)


async def run_emulators_forever(host: str, first_port: int) -> None:
    running = await start_emulators(host, first_port)
    for item in running.values():
        print(f"{item.prefix:<10} {item.base_url}  key={item.api_key}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await stop_emulators(running)
