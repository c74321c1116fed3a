"""Which emulator stands in for which provider prefix, and starting them all."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from emulators.anthropic import AnthropicEmulator
from emulators.common import Emulator, serve
from emulators.gemini import GeminiEmulator
from emulators.openai import OpenAIEmulator


@dataclass
class Running:
    prefix: str
    base_url: str
    api_key: str
    emulator: Emulator
    runner: web.AppRunner


# prefix -> (factory(api_key) -> the emulator, path of the API root)
FACTORIES: dict[str, tuple[Callable[[str], Emulator], str]] = {
    "openai": (lambda key: OpenAIEmulator("openai", key), "/v1"),
    "upstage": (lambda key: OpenAIEmulator("upstage", key), "/v1"),
    "mistral": (lambda key: OpenAIEmulator("mistral", key), "/v1"),
    "anthropic": (AnthropicEmulator, "/v1"),
    "google": (GeminiEmulator, "/v1beta"),
}


async def start_emulators(host: str = "127.0.0.1", first_port: int = 0) -> dict[str, Running]:
    """Start every emulator; ``first_port`` 0 picks free ports, else consecutive ports from it. When a
    port is taken, the ones already started stop again and the OSError is raised."""
    running: dict[str, Running] = {}
    try:
        for offset, (prefix, (factory, root)) in enumerate(sorted(FACTORIES.items())):
            key = f"emu-{prefix}-key"
            emulator = factory(key)
            runner, port = await serve(emulator.app, host, first_port + offset if first_port else 0)
            running[prefix] = Running(prefix, f"http://{host}:{port}{root}", key, emulator, runner)
    except OSError:
        await stop_emulators(running)
        raise
    return running


async def stop_emulators(running: dict[str, Running]) -> None:
    for item in running.values():
        await item.runner.cleanup()
