"""Shared names: ASGI callables, the small vocabularies of a call (endpoint, source, status) and
aliases used across the package."""

import random
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The ASGI scope extension (``scope["extensions"][RECEIVE_WATCH]``) by which the server (server/channels.py)
# offers ``{"watch": watch}``: ``watch(f)`` hands each message that ``receive`` would return to ``f`` as
# it comes instead, until ``watch(None)``. An app answering for a long time hears the caller's
# ``http.disconnect`` without a task waiting on ``receive`` (router/replies.py, SSE); under a server
# without it, the app keeps such a task.
RECEIVE_WATCH = "router.receive.watch"

JSON = dict[str, Any]
Headers = list[tuple[bytes, bytes]]

Endpoint = Literal[
    "chat", "responses", "messages", "embeddings", "images"
]  # which of our model endpoints a call came through (catalog: endpoints)
Source = Literal["api", "job"]  # an HTTP caller, or a line of a batch (jobs/)
CallStatus = Literal["ok", "error", "interrupted", "rejected"]  # how a call ended, in its usage record


_ids = random.Random()  # noqa: S311 (request ids are not secrets: new_id)


def new_id() -> str:
    """A 96-bit random hex id for requests and answers. Not a secret (keys use ``secrets``), so it is
    drawn from a fast PRNG seeded from the OS: ``os.urandom`` costs tens of microseconds here."""
    return f"{_ids.getrandbits(96):024x}"
