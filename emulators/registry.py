"""Which emulator stands in for which provider prefix, and starting them all."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from emulators.common import serve
from emulators.openai import OpenAIEmulator


@dataclass
class Running:
    prefix: str
    base_url: str
    api_key: str
    emulator: object
    runner: web.AppRunner


# prefix -> (factory(api_key) -> object with .app, path of the API root)
FACTORIES: dict[str, tuple[Callable[[str], object], str]] = {
    "openai": (lambda key: OpenAIEmulator("openai", key), "/v1"),
    "upstage": (lambda key: OpenAIEmulator("upstage", key), "/v1"),
    "mistral": (lambda key: OpenAIEmulator("mistral", key), "/v1"),
}

for _module, _prefix, _root in (("emulators.anthropic", "anthropic", "/v1"), ("emulators.gemini", "google", "/v1beta")):
    try:
        _mod = importlib.import_module(_module)
    except ModuleNotFoundError as _exc:
        if _exc.name != _module:
            raise
    else:
        FACTORIES[_prefix] = (_mod.EMULATOR, _root)


async def start_emulators(host: str = "127.0.0.1", first_port: int = 0) -> dict[str, Running]:
    """Start every emulator; ``first_port`` 0 picks free ports, else consecutive ports from it."""
    running: dict[str, Running] = {}
    for offset, (prefix, (factory, root)) in enumerate(sorted(FACTORIES.items())):
        key = f"emu-{prefix}-key"
        emulator = factory(key)
        runner, port = await serve(emulator.app, host, first_port + offset if first_port else 0)  # type: ignore[attr-defined]
        running[prefix] = Running(prefix, f"http://{host}:{port}{root}", key, emulator, runner)
    return running


async def stop_emulators(running: dict[str, Running]) -> None:
    for item in running.values():
        await item.runner.cleanup()
