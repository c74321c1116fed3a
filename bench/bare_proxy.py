"""The floor of our stack: Starlette + hypercorn + aiohttp passing requests through, with no features.

    python bench/bare_proxy.py --port P --upstream http://127.0.0.1:9101/v1 --key emu-openai-key

No auth, no parsing, no billing: the body goes upstream as-is with the upstream's key, the answer comes
back as-is (streams chunk by chunk). Same hypercorn settings as ``router serve``, uvloop when present.
``--server hypercorn-tuned``: on the gateway's own server layer (what ``router serve`` installs under
hypercorn: server/connections.py's connections and keep-alive timer, server/fast_http1.py's HTTP/1.1
on httptools, server/channels.py), to tell what the gateway's features cost from what its
server layer saves (bench.instructions reports both).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str, key: str) -> Starlette:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    session: dict[str, aiohttp.ClientSession] = {}

    async def chat(request: Request) -> Response:
        body = await request.body()
        response = await session["s"].post(f"{upstream}/chat/completions", data=body, headers=headers)
        ctype = response.headers.get("Content-Type", "application/json")
        if not ctype.startswith("text/event-stream"):
            try:
                return Response(await response.read(), status_code=response.status, media_type=ctype)
            finally:
                response.release()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            finally:
                response.release()

        return StreamingResponse(relay(), status_code=response.status, media_type=ctype)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        session["s"] = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        try:
            yield
        finally:
            await session["s"].close()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/healthz", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def main(host: str, port: int, upstream: str, key: str) -> None:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = 75
    config.backlog = 4096
    config.graceful_timeout = 5
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await serve(create_app(upstream.rstrip("/"), key), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="API root of the upstream, e.g. http://h:p/v1")
    parser.add_argument("--key", required=True, help="the upstream's API key")
    parser.add_argument("--server", choices=["hypercorn", "hypercorn-tuned", "uvicorn"], default="hypercorn")
    args = parser.parse_args()
    if args.server == "hypercorn-tuned":
        from core.config import ServerSettings
        from server.serve import install_server_layer

        install_server_layer(ServerSettings())  # what router serve runs hypercorn on, default caps
    if args.server == "uvicorn":  # the floor of the gateway's uvicorn run (bench gw-uvicorn)
        import uvicorn

        uvicorn.run(
            create_app(args.upstream.rstrip("/"), args.key),
            host=args.host,
            port=args.port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
        )
        raise SystemExit(0)
    run: Any = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    run(main(args.host, args.port, args.upstream, args.key))
