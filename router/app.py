"""The ASGI application: ``create_app(settings)``.

Standalone it runs under hypercorn (``router serve``); embedded, another Starlette/FastAPI app mounts
it under a prefix (``Mount("/llm", app=create_app(settings))``) and it starts itself on first use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount

from billing.store import Store, StoreDown
from console import console_app
from core.config import Settings
from core.errors import GatewayError, MethodNotAllowed, NotFound, StoreUnavailable
from core.redact import redact_keys
from core.types import ASGIApp, Scope
from gateway.state import Gateway
from jobs.runner import JobRunner
from router import batches, endpoints, logs, messages, openapi, stored_responses
from router.chat import ChatCompletions, record_refusal
from router.dialects import MESSAGES, MESSAGES_PATH, RESPONSES, error_response, of_path
from router.embeddings import Embeddings
from router.endpoints import Endpoint
from router.health import Readiness, metrics_endpoint
from router.images import Images
from router.middleware import ErrorApp, Front, cors, route_path
from router.models import Models
from router.replies import JSONBytes
from router.responses_api import Responses

log = logging.getLogger("router")
SERVED = (
    "/v1/chat/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/images/generations, "
    "/v1/images/edits, /v1/models"
)
CONSOLE_ONLY = "this listener serves the console, /console"  # [console] listen


def answer(error: GatewayError, scope: Scope, dialects: Mapping[str, str]) -> Response:
    """The one answer to an error, whoever caught it (Front for its fast endpoints, Starlette's
    handlers for the rest), in the dialect of the endpoint it came from (router/dialects.py). A key
    of the gateway's in its message (pasted into the path or an id the message echoes) is redacted
    first (core/redact.py)."""
    path = route_path(scope)
    error.message = redact_keys(error.message, logs.trace_of(scope).key_prefix)
    return error_response(error, dialects.get(path) or of_path(path))


def as_error(exc: Exception, scope: Scope, serves: str = SERVED) -> GatewayError:
    """Any exception as the error the caller gets: a ``GatewayError`` as it is, the store out of reach
    as 503 with ``Retry-After``, Starlette's 404 and 405 as ours, anything else a generic 500."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, StoreDown):  # the store cannot be used now: the caller may retry
        return StoreUnavailable()
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return MethodNotAllowed(f"Method {scope['method']} is not allowed on {scope['path']}.")
    if isinstance(exc, HTTPException) and exc.status_code == 404:
        return NotFound(f"Unknown path {scope['path']}: {serves}.")
    if isinstance(exc, HTTPException):
        return GatewayError(str(exc.detail))
    return GatewayError("The gateway hit an internal error; the request was not completed.")


def _handler(
    dialects: Mapping[str, str], serves: str = SERVED
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's exception handler (every class of exception): :func:`answer`, after logging a crash."""

    async def handle(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, GatewayError | HTTPException):
            log.exception(
                "unhandled error on %s",
                redact_keys(request.url.path, logs.trace_of(request.scope).key_prefix),
            )
        return answer(as_error(exc, request.scope, serves), request.scope, dialects)

    return handle


def _answerer(gateway: Gateway, dialects: Mapping[str, str]) -> ErrorApp:
    """Front's answer to an exception of a model call endpoint; a call refused before anything was
    reserved is recorded first (``rejected``)."""

    def respond(exc: Exception, scope: Scope) -> ASGIApp:
        error = as_error(exc, scope)
        response = answer(error, scope, dialects)
        if isinstance(exc, GatewayError | StoreDown):  # (its message as answered: redacted)
            record_refusal(gateway, logs.trace_of(scope), error)
        return response

    return respond


async def _health(request: Request) -> Response:
    return JSONBytes(b'{"status":"ok"}')


class RouterApp(Starlette):
    """Starlette with :class:`router.middleware.Front` outside its middleware stack: the request id,
    metrics and access log of every request, and the hot endpoints called without Starlette's layers;
    CORS, when configured, outside that."""

    def __init__(
        self,
        *,
        fast: dict[str, ASGIApp],
        access_log: bool,
        cors_origins: list[str],
        on_error: ErrorApp,
        drain_bytes: int,
        drain_seconds: float,
        key_prefix: str,
        **kwargs: Any,
    ) -> None:
        self.drain_bytes, self.drain_seconds = drain_bytes, drain_seconds
        self.key_prefix = key_prefix
        self.fast = fast
        self.on_error = on_error
        self.access_log = access_log
        self.cors_origins = cors_origins
        super().__init__(**kwargs)

    def build_middleware_stack(self) -> ASGIApp:
        front = Front(
            super().build_middleware_stack(),
            access_log=self.access_log,
            fast=self.fast,
            on_error=self.on_error,
            drain_bytes=self.drain_bytes,
            drain_seconds=self.drain_seconds,
            key_prefix=self.key_prefix,
        )
        return cors(front, self.cors_origins)  # outside Front: preflights of the fast paths too


async def _openapi(request: Request) -> Response:
    return Response(openapi.encoded(), media_type="application/json")


def create_app(settings: Settings | None = None, *, store: Store | None = None) -> Starlette:
    gateway = Gateway(settings or Settings(), store=store)
    models = Models(gateway)
    obs = gateway.settings.observability
    logs.setup(obs)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    console = gateway.settings.console
    # the console beside /v1, or on a listener of its own: a second app on the same gateway, which
    # `router serve` serves on [console] listen (server/serve.py)
    beside = console.enabled and not console.listen
    chat, responses = ChatCompletions(gateway).handle, Responses(gateway).handle
    anthropic = messages.Messages(gateway)
    images = Images(gateway)
    table = [
        Endpoint("/v1/chat/completions", chat, fast=True),
        Endpoint("/v1/responses", responses, fast=True, dialect=RESPONSES),
        Endpoint(MESSAGES_PATH, anthropic.handle, fast=True, dialect=MESSAGES),
        Endpoint(f"{MESSAGES_PATH}/count_tokens", anthropic.count_tokens, fast=True, dialect=MESSAGES),
        Endpoint("/v1/embeddings", Embeddings(gateway).handle, fast=True),
        Endpoint("/v1/images/generations", images.generations, fast=True),
        Endpoint("/v1/images/edits", images.edits, fast=True),
        Endpoint("/v1/models", models.list, ("GET",)),
        Endpoint("/v1/models/{model:path}", models.retrieve, ("GET",)),
        Endpoint("/healthz", _health, ("GET",)),
        Endpoint("/readyz", Readiness(gateway).endpoint, ("GET",)),
        Endpoint("/openapi.json", _openapi, ("GET",)),
        *([Endpoint("/metrics", metrics_endpoint, ("GET",))] if obs.metrics else []),
    ]
    dialects = endpoints.dialects(table)
    handlers = _handler(dialects)
    app = RouterApp(
        fast=endpoints.fast_map(
            table
        ),  # POST on these is answered by Front directly; the routes answer other methods (405)
        access_log=obs.access_log,
        on_error=_answerer(gateway, dialects),
        drain_bytes=gateway.settings.server.max_body_bytes,
        drain_seconds=gateway.settings.reliability.body_timeout,
        cors_origins=gateway.settings.server.cors_origins,
        key_prefix=gateway.settings.server.key_prefix,
        routes=[
            *endpoints.routes(table),
            *([Mount("/console", app=console_app(gateway))] if beside else []),
            *batches.routes(gateway),  # /v1/files, /v1/batches
            *stored_responses.routes(gateway),  # /v1/responses/{id}[/input_items|/cancel]
        ],
        exception_handlers={GatewayError: handlers, HTTPException: handlers, Exception: handlers},
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.console_listener = None
    if console.enabled and console.listen:
        only = _handler({}, CONSOLE_ONLY)
        own = RouterApp(
            fast={},
            access_log=obs.access_log,
            on_error=_answerer(gateway, {}),
            cors_origins=[],
            drain_bytes=gateway.settings.server.max_body_bytes,
            drain_seconds=gateway.settings.reliability.body_timeout,
            key_prefix=gateway.settings.server.key_prefix,
            routes=[Mount("/console", app=console_app(gateway))],
            exception_handlers={GatewayError: only, HTTPException: only, Exception: only},
        )
        own.state.gateway = gateway
        app.state.console_listener = (console.listen, own)
    # runs batch lines and background responses as in-process calls to this app
    gateway.jobs = gateway.batches = gateway.backgrounds = JobRunner(gateway, app)
    return app
