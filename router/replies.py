"""Response classes: each overrides one thing of Starlette's Response.

``JSONBytes`` sends bytes that are already encoded (msgspec); ``extra`` headers (raw ASGI pairs, such
as the rate limits' ``x-ratelimit-*``) go out as they are. ``SSE`` streams server-sent events and
watches the connection: when the caller disconnects, the stream is cancelled at once (so the upstream
read stops) and its iterator is closed, which runs its ``finally`` (billing) before we return.
``LateSSE`` overrides how the response begins: not before its stream has opened the upstream (or
the keep-alive timer fired).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, cast

from starlette.responses import Response

from core.catalog import Catalog, ProviderSpec
from core.errors import GatewayError
from core.types import RECEIVE_WATCH, Headers, Message, Receive, Scope, Send

_JSON = (b"content-type", b"application/json")


OMITTED = b"x-router-omitted-tools"  # the hosted tools a translated call left out (Responses, Messages)


def name_omitted(
    response: Response,
    catalog: Catalog,
    model_id: Any,
    names: list[str],
    runs_them: Callable[[ProviderSpec], bool],
) -> None:
    """Name in ``OMITTED`` the hosted tools (``names``) a translated call left out: none when the model's
    provider runs them itself (``runs_them`` of its catalog entry)."""
    if not names:
        return
    try:
        model = catalog.resolve(str(model_id))
    except GatewayError:
        pass
    else:
        if runs_them(catalog.providers[model.provider]):
            return
    response.raw_headers.append((OMITTED, ", ".join(names).encode()))


class JSONBytes(Response):
    media_type = "application/json"

    def __init__(
        self,
        content: bytes,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        extra: Headers | None = None,
    ) -> None:
        if headers is not None:
            super().__init__(content, status_code, headers)
        else:  # Starlette's init_headers, without encoding what is known already
            self.status_code = status_code
            self.background = None
            self.body = bytes(content)
            self.raw_headers = [(b"content-length", b"%d" % len(self.body)), _JSON]
        if extra:
            self.raw_headers += extra

    def render(self, content: object) -> bytes:
        assert isinstance(content, bytes | bytearray)
        return bytes(content)


_SSE = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)


class SSE(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        stream: AsyncGenerator[bytes, None],
        extra: Headers | None = None,
        finalize: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.stream = stream
        self.finalize = finalize  # runs last, also when the stream never started
        self.status_code = 200
        self.background = None
        self.raw_headers = [*_SSE, *(extra or ())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def heard(message: Message) -> None:
            nonlocal gone
            if message["type"] == "http.disconnect" and not gone:
                gone = True
                task.cancel()

        async def watch() -> None:
            while not gone:
                heard(await receive())

        # a server that offers the RECEIVE_WATCH extension (server/channels.py) hands each message to
        # heard as it comes, with no task waiting on receive for the whole stream (a task, its
        # coroutines and a future: ~1 KB of an open stream's memory); any other server, such a task
        offer = scope.get("extensions", {}).get(RECEIVE_WATCH)
        watcher: asyncio.Task[None] | None = None
        if offer is not None:
            offer["watch"](heard)
        else:
            watcher = asyncio.create_task(watch())
        try:
            await self.begin(send)
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
            if offer is not None:
                offer["watch"](None)
            if watcher is not None:
                watcher.cancel()
            await self.stream.aclose()
            if self.finalize is not None:
                await self.finalize()

    async def begin(self, send: Send) -> None:
        """Start the response (its status and headers)."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})


KEEPALIVE = b": keep-alive\n\n"


class LateSSE(SSE):
    """An SSE response whose stream first opens its upstream: the stream's first item is the
    headers to add (say ``x-ratelimit-*``), and the response starts with them. If opening fails
    before anything was sent, the error propagates (a plain HTTP error). If it takes longer than
    ``keepalive`` seconds, the response starts without them and sends SSE comments every
    ``keepalive`` seconds until the stream goes on; a gateway error then becomes the last event,
    ``failed(error)``. No task runs while the upstream answers in time: one timer."""

    def __init__(
        self,
        stream: AsyncGenerator[bytes | Headers, None],
        keepalive: float,
        failed: Callable[[GatewayError], bytes],
    ) -> None:
        # begin() takes the headers, its first item; SSE.__call__ then sends the rest, all bytes
        super().__init__(cast(AsyncGenerator[bytes, None], stream))
        self.keepalive = keepalive
        self.failed = failed

    async def begin(self, send: Send) -> None:
        early: list[_KeepAlive] = []
        timer = asyncio.get_running_loop().call_later(
            self.keepalive, lambda: early.append(_KeepAlive(self, send))
        )
        error: GatewayError | None = None
        try:
            extra = await self.stream.__anext__()
        except GatewayError as exc:
            if not early:
                raise  # nothing sent yet: a plain HTTP error
            error = exc
        except BaseException:  # cancelled (the caller left), or a bug: the keep-alive stops at once
            for keepalive in early:
                keepalive.task.cancel()
            raise
        finally:
            timer.cancel()
        if early:  # the response has started (or starts now: the timer fired in this very turn)
            await early[0].end()
        if error is not None:  # (the stream has ended: it raised)
            await send({"type": "http.response.body", "body": self.failed(error), "more_body": True})
        elif not early:
            assert isinstance(extra, list)
            self.raw_headers += extra
            await super().begin(send)


class _KeepAlive:
    """A :class:`LateSSE` started early: its start, then a comment every ``keepalive`` seconds until
    :meth:`end`, which lets the send under way finish rather than cancel it. A task cancelled before
    its first step never sent the start (the upstream's answer and the timer met in one loop turn:
    the body then went out with no start, a 500), and one cancelled inside a send may have written
    bytes the server's state does not show."""

    __slots__ = ("stopped", "task")

    def __init__(self, response: LateSSE, send: Send) -> None:
        self.stopped = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(response, send))

    async def _run(self, response: LateSSE, send: Send) -> None:
        await SSE.begin(response, send)
        while not self.stopped.is_set():
            await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), response.keepalive)

    async def end(self) -> None:
        """Stop after the send under way; a send that failed (the caller gone) fails the next one."""
        self.stopped.set()
        await asyncio.wait((self.task,))
        if not self.task.cancelled():
            self.task.exception()  # (retrieved: the response's next send meets the same failure)
