"""Shared names: ASGI callables and small aliases used across the package."""

import random
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = dict[str, Any]
Headers = list[tuple[bytes, bytes]]


_ids = random.Random()


def new_id() -> str:
    """A 96-bit random hex id for requests and answers. Not a secret (keys use ``secrets``), so it is
    drawn from a fast PRNG seeded from the OS: ``os.urandom`` costs tens of microseconds here."""
    return f"{_ids.getrandbits(96):024x}"
