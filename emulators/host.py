"""What the OpenAI emulator's endpoint handlers (embeddings, images, the Responses API) read of the
emulator that owns the app (:class:`emulators.openai.OpenAIEmulator`, and
:class:`emulators.azure.AzureOpenAIEmulator` for embeddings and images): its flavour and key, the key
check, the body, the request log, limits, flakiness, the streams it wrote, and its error envelope.
A protocol, so that the handlers' modules do not import the emulator that imports them."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from emulators.directives import Flakiness


class Host(Protocol):
    flavour: str
    api_key: str
    flakiness: Flakiness
    streams: list[tuple[str, int]]  # ("complete" | "disconnected", events written)

    def _authorised(self, request: web.Request) -> bool: ...

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response: ...

    def received(self, body: dict[str, Any], headers: Any = None) -> None: ...

    def over_limit(self) -> float | None: ...

    def rate_limited(self, wait: float) -> web.Response: ...

    def error(
        self, status: int, message: str, type_: str, code: str | None = None, headers: dict | None = None
    ) -> web.Response: ...

    def fault(self, status: int) -> web.Response: ...
