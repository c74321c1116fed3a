"""Response classes: each overrides one thing of Starlette's Response.

``JSONBytes`` sends bytes that are already encoded (msgspec). ``SSE`` streams server-sent events and
watches the connection: when the caller disconnects, the stream is cancelled at once (so the upstream
read stops) and its iterator is closed, which runs its ``finally`` (billing) before we return.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from starlette.responses import Response

from router.types import Receive, Scope, Send


class JSONBytes(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        assert isinstance(content, bytes | bytearray)
        return bytes(content)


class SSE(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        stream: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        finalize: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.stream = stream
        self.finalize = finalize  # runs last, also when the stream never started
        self.status_code = 200
        self.background = None
        base = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        if headers:
            base.update(headers)
        self.init_headers(base)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for piece in self.stream:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
        except OSError:
            gone = True  # the server told us the client is gone
        finally:
            watcher.cancel()
            await self.stream.aclose()
            if self.finalize is not None:
                await self.finalize()
