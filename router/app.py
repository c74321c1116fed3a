"""The ASGI application: ``create_app(settings)``.

Standalone it runs under hypercorn (``router serve``); embedded, another Starlette/FastAPI app mounts
it under a prefix (``Mount("/llm", app=create_app(settings))``) and it starts itself on first use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from billing.store import Store, StoreDown
from console import console_app
from core.config import Settings
from core.errors import GatewayError, MethodNotAllowed, NotFound, StoreUnavailable
from core.redact import redact_keys
from core.types import ASGIApp, Scope
from gateway.state import Gateway
from jobs.runner import JobRunner
from router import batches, logs, messages, openapi, stored_responses
from router.chat import ChatCompletions, record_refusal
from router.embeddings import Embeddings
from router.health import Readiness, metrics_endpoint
from router.images import Images
from router.middleware import ErrorApp, Front, cors, endpoint_app, route_path
from router.models import Models
from router.replies import JSONBytes
from router.responses_api import Responses

log = logging.getLogger("router")
MESSAGES = "/v1/messages"  # Anthropic's Messages API: its errors in Anthropic's dialect


def _error_response(exc: GatewayError, path: str = "", scope: Scope | None = None) -> Response:
    """``exc`` in its caller's dialect: Anthropic's on its Messages API, OpenAI's everywhere else. Every
    error the app answers passes here: a key of the gateway's in its message (pasted into the path or
    an id the message echoes) is redacted first (core/redact.py)."""
    if scope is not None:
        exc.message = redact_keys(exc.message, logs.trace_of(scope).key_prefix)
    if path.startswith(MESSAGES):
        return messages.error_response(exc)
    return JSONBytes(exc.render(), status_code=exc.status, headers=exc.headers)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _error_response(exc, route_path(request.scope), request.scope)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = route_path(request.scope)
    if exc.status_code == 405:
        return _error_response(MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}."), path, request.scope)
    if exc.status_code == 404:
        return _error_response(NotFound(f"Unknown path {request.url.path}: this gateway serves /v1/chat/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/images/generations, /v1/images/edits, /v1/models."), path, request.scope)
    return _error_response(GatewayError(str(exc.detail)), path, request.scope)


async def _console_only(request: Request, exc: Exception) -> Response:
    """The console's own listener ([console] listen) serves /console alone."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error_response(NotFound(f"Unknown path {request.url.path}: this listener serves the console, /console."), scope=request.scope)
    return await _http_error(request, exc)


def _answerer(gateway: Gateway) -> ErrorApp:
    """Front's answer to an exception of a model call endpoint; a call refused before anything was
    reserved is recorded first (``rejected``)."""

    def answer(exc: Exception, scope: Scope) -> ASGIApp:
        if isinstance(exc, StoreDown):
            exc = StoreUnavailable()
        response = _answer(exc, route_path(scope), scope)
        if isinstance(exc, GatewayError):
            record_refusal(gateway, logs.trace_of(scope), exc)  # (its message as answered: redacted)
        return response

    return answer


def _answer(exc: Exception, path: str, scope: Scope | None = None) -> Response:
    """The error response of an exception (a GatewayError's own, or a generic 500)."""
    if isinstance(exc, GatewayError):
        return _error_response(exc, path, scope)
    if isinstance(exc, StoreDown):  # the store cannot be used now: the caller may retry (503, Retry-After)
        return _error_response(StoreUnavailable(), path)
    return _error_response(GatewayError("The gateway hit an internal error; the request was not completed."), path)


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", redact_keys(request.url.path, logs.trace_of(request.scope).key_prefix))
    return _answer(exc, route_path(request.scope), request.scope)


async def _health(request: Request) -> Response:
    return JSONBytes(b'{"status":"ok"}')


class RouterApp(Starlette):
    """Starlette with :class:`router.middleware.Front` outside its middleware stack: the request id,
    metrics and access log of every request, and the hot endpoints called without Starlette's layers;
    CORS, when configured, outside that."""

    def __init__(self, *, fast: dict[str, ASGIApp], access_log: bool, cors_origins: list[str],
                 on_error: ErrorApp, drain_bytes: int, drain_seconds: float, key_prefix: str,
                 **kwargs: Any) -> None:  # fmt: skip
        self.drain_bytes, self.drain_seconds = drain_bytes, drain_seconds
        self.key_prefix = key_prefix
        self.fast = fast
        self.on_error = on_error
        self.access_log = access_log
        self.cors_origins = cors_origins
        super().__init__(**kwargs)

    def build_middleware_stack(self) -> ASGIApp:
        front = Front(
            super().build_middleware_stack(), access_log=self.access_log, fast=self.fast, on_error=self.on_error,
            drain_bytes=self.drain_bytes, drain_seconds=self.drain_seconds, key_prefix=self.key_prefix,
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
    embeddings = Embeddings(gateway).handle
    images = Images(gateway)
    app = RouterApp(
        # POST on these is answered by Front directly; the routes answer other methods (405)
        fast={"/v1/chat/completions": endpoint_app(chat), "/v1/responses": endpoint_app(responses),
              MESSAGES: endpoint_app(anthropic.handle), f"{MESSAGES}/count_tokens": endpoint_app(anthropic.count_tokens),
              "/v1/embeddings": endpoint_app(embeddings), "/v1/images/generations": endpoint_app(images.generations),
              "/v1/images/edits": endpoint_app(images.edits)},
        access_log=obs.access_log,
        on_error=_answerer(gateway),
        drain_bytes=gateway.settings.server.max_body_bytes,
        drain_seconds=gateway.settings.reliability.body_timeout,
        cors_origins=gateway.settings.server.cors_origins,
        key_prefix=gateway.settings.server.key_prefix,
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route(MESSAGES, anthropic.handle, methods=["POST"]),
            Route(f"{MESSAGES}/count_tokens", anthropic.count_tokens, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/images/generations", images.generations, methods=["POST"]),
            Route("/v1/images/edits", images.edits, methods=["POST"]),
            Route("/v1/models", models.list, methods=["GET"]),
            Route("/v1/models/{model:path}", models.retrieve, methods=["GET"]),
            Route("/healthz", _health, methods=["GET"]),
            Route("/readyz", Readiness(gateway).endpoint, methods=["GET"]),
            Route("/openapi.json", _openapi, methods=["GET"]),
            *([Route("/metrics", metrics_endpoint, methods=["GET"])] if obs.metrics else []),
            *([Mount("/console", app=console_app(gateway))] if beside else []),
            *batches.routes(gateway),  # /v1/files, /v1/batches
            *stored_responses.routes(gateway),  # /v1/responses/{id}[/input_items|/cancel]
        ],
        exception_handlers={GatewayError: _gateway_error, HTTPException: _http_error, Exception: _crash},
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.console_listener = None
    if console.enabled and console.listen:
        own = RouterApp(
            fast={}, access_log=obs.access_log, on_error=_answerer(gateway), cors_origins=[],
            drain_bytes=gateway.settings.server.max_body_bytes, drain_seconds=gateway.settings.reliability.body_timeout,
            key_prefix=gateway.settings.server.key_prefix, routes=[Mount("/console", app=console_app(gateway))],
            exception_handlers={GatewayError: _gateway_error, HTTPException: _console_only, Exception: _crash},
        )  # fmt: skip
        own.state.gateway = gateway
        app.state.console_listener = (console.listen, own)
    # runs batch lines and background responses as in-process calls to this app
    gateway.jobs = gateway.batches = gateway.backgrounds = JobRunner(gateway, app)
    return app
