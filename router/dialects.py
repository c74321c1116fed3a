"""How an endpoint says an error, by its dialect: the one rule for every answer and every stream.

    CHAT        OpenAI's error object (core/errors.py); in a stream, one chunk ``{"error": ...}``
                then ``data: [DONE]`` (what the OpenAI SDKs raise on)
    RESPONSES   OpenAI's error object; in a stream, the Responses API's ``error`` event
    MESSAGES    Anthropic's ``{"type": "error", "error": ...}`` with Anthropic's statuses
                (core.errors.anthropic_error); in a stream, Anthropic's ``error`` event

Each endpoint names its dialect once (router/endpoints.py); a path that no endpoint serves speaks
Anthropic's under ``/v1/messages`` and OpenAI's elsewhere. A stream's error after its upstream began
is the codec's (gateway/), written by the same event functions as here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import msgspec
from starlette.responses import Response

from core.errors import GatewayError, anthropic_error
from core.sse import DONE, frame, frame_event
from gateway.messages_events import error_event as anthropic_event
from gateway.stream import error_chunk
from router.replies import JSONBytes

CHAT = "chat"
RESPONSES = "responses"
MESSAGES = "messages"
MESSAGES_PATH = "/v1/messages"

_encode = msgspec.json.Encoder().encode


def of_path(path: str) -> str:
    """The dialect of a path no endpoint claims (an unknown path, a method not allowed)."""
    return MESSAGES if path.startswith(MESSAGES_PATH) else CHAT


def error_response(exc: GatewayError, dialect: str) -> Response:
    """``exc`` as the HTTP answer of an endpoint of ``dialect``."""
    if dialect == MESSAGES:
        status, body = anthropic_error(exc)
        return JSONBytes(body, status_code=status, headers=exc.headers)
    return JSONBytes(exc.render(), status_code=exc.status, headers=exc.headers)


def error_event(exc: GatewayError, dialect: str) -> bytes:
    """``exc`` as the last bytes of a stream of ``dialect`` (a stream that had sent only keep-alives)."""
    if dialect == MESSAGES:
        return anthropic_event(exc)
    if dialect == RESPONSES:
        event = {
            "type": "error",
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
            "sequence_number": 0,
        }
        return frame_event("error", _encode(event))
    return frame(_encode(error_chunk(exc))) + DONE


def events_of(dialect: str) -> Callable[[GatewayError], bytes]:
    """``error_event`` bound to ``dialect`` (what a late stream calls with its error)."""
    return partial(error_event, dialect=dialect)
