"""Every endpoint of the app declared once: its path, methods, handler, whether ``Front`` calls it
straight (the hot model-call endpoints: router/middleware.py) and its error dialect
(router/dialects.py). Both of the app's dispatch maps, Front's fast map and Starlette's routes, are
made from one table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from core.types import ASGIApp
from router.dialects import CHAT
from router.middleware import endpoint_app

Handler = Callable[[Request], Awaitable[Response]]


class Endpoint(NamedTuple):
    path: str
    handler: Handler
    methods: tuple[str, ...] = ("POST",)
    # its POST answered by Front without Starlette's layers (other methods: 405 by the route)
    fast: bool = False
    dialect: str = CHAT


def fast_map(table: Iterable[Endpoint]) -> dict[str, ASGIApp]:
    """Front's map: path -> the ASGI app answering its POST."""
    return {e.path: endpoint_app(e.handler) for e in table if e.fast}


def routes(table: Iterable[Endpoint]) -> list[BaseRoute]:
    return [Route(e.path, e.handler, methods=list(e.methods)) for e in table]


def dialects(table: Iterable[Endpoint]) -> dict[str, str]:
    """path -> its error dialect."""
    return {e.path: e.dialect for e in table}
