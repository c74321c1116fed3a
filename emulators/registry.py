"""Which emulator stands in for which provider prefix, and starting them all."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web

from emulators.anthropic import AnthropicEmulator
from emulators.azure import AzureOpenAIEmulator
from emulators.common import Emulator, serve
from emulators.gemini import GeminiEmulator
from emulators.openai import OpenAIEmulator


@dataclass
class Running:
    prefix: str  # the provider group it serves
    base_url: str
    api_key: str
    emulator: Emulator
    runner: web.AppRunner
    name: str = ""  # its name among the group's deployments (the prefix for the group's own emulator)


# prefix -> (factory(api_key) -> the emulator, path of the API root)
FACTORIES: dict[str, tuple[Callable[[str], Emulator], str]] = {
    "openai": (lambda key: OpenAIEmulator("openai", key), "/v1"),
    "upstage": (lambda key: OpenAIEmulator("upstage", key), "/v1"),
    "mistral": (lambda key: OpenAIEmulator("mistral", key), "/v1"),
    "anthropic": (AnthropicEmulator, "/v1"),
    "google": (GeminiEmulator, "/v1beta"),
}

# More deployments of a group, each with its own key (the demo's openai/ has three): name -> (prefix,
# factory(api_key), path of the API root). ``second`` allows 60 requests a minute, then answers 429.
DEPLOYMENTS: dict[str, tuple[str, Callable[[str], Emulator], str]] = {
    "second": ("openai", lambda key: OpenAIEmulator("openai", key, rpm=60), "/v1"),
    "azure": ("openai", AzureOpenAIEmulator, ""),
}


async def start_emulators(
    host: str = "127.0.0.1", first_port: int = 0, deployments: bool = False
) -> dict[str, Running]:
    """Start every emulator (with ``deployments``, the extra ones too, under their names); ``first_port``
    0 picks free ports, else consecutive ports from it. When a port is taken, the ones already started
    stop again and the OSError is raised."""
    plan = [(prefix, prefix, factory, root) for prefix, (factory, root) in sorted(FACTORIES.items())]
    if deployments:
        plan += [(name, prefix, factory, root) for name, (prefix, factory, root) in DEPLOYMENTS.items()]
    running: dict[str, Running] = {}
    try:
        for offset, (name, prefix, factory, root) in enumerate(plan):
            key = f"emu-{name}-key"
            emulator = factory(key)
            runner, port = await serve(emulator.app, host, first_port + offset if first_port else 0)
            running[name] = Running(prefix, f"http://{host}:{port}{root}", key, emulator, runner, name)
    except OSError:
        await stop_emulators(running)
        raise
    return running


# the line ``router emulators`` prints for each one it started, and reads back from its output
_BANNER = re.compile(r"^(\w+)\s+(http://\S+)\s+key=(\S+)\s*$")


def banner_line(item: Running) -> str:
    return f"{item.prefix:<10} {item.base_url}  key={item.api_key}"


def read_banner(lines: Iterable[str]) -> dict[str, tuple[str, str]]:
    """From the output of ``router emulators``: prefix -> (base URL, key), read up to the line of its
    last provider group (an iterator of a running process's output is left there). Fewer: the output
    ended first."""
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        match = _BANNER.match(line)
        if match:
            found[match.group(1)] = (match.group(2), match.group(3))
            if len(found) == len(FACTORIES):
                break
    return found


async def stop_emulators(running: dict[str, Running]) -> None:
    for item in running.values():
        await item.runner.cleanup()
