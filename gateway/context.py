"""``CallContext``: who makes one model call and how, fixed before it runs.

The HTTP layer builds it from the authenticated request (``source="api"``); the batch runner builds it
for each line (``source="job"``, the batch's id) and hands it to the gateway's own app in the ASGI
scope's state, under :data:`CONTEXT`, where no HTTP request can put anything. The pipeline reads the
caller, the endpoint and the ids from it, and the usage record is written from it: :meth:`record`
once something is reserved (the ledger settles it), :meth:`rejected` for a call refused before that,
so that every call made with a key leaves exactly one record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from billing.store import Principal, UsageRecord
from core.errors import GatewayError
from core.redact import DEFAULT_KEY_PREFIX, holds_key, redact_keys
from core.types import Endpoint, Source

CONTEXT = "call"  # the scope["state"] key of an in-process call's context (jobs/calls.py)
MAX_USER = 256  # characters of the request's ``user`` kept on the record
MAX_MODEL = 128  # characters of an unknown model id kept on a rejected call's record
MAX_METADATA = 2048  # characters of the request's metadata (as JSON) kept on the record
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class CallContext:
    principal: Principal  # the caller: its key and group
    request_id: str | None = None  # our x-request-id of the call
    source: Source = "api"
    endpoint: Endpoint = "chat"
    batch_id: str | None = None  # the batch a job line belongs to
    end_user: str | None = None  # the request's ``user``, once its body is read (see :func:`identify`)
    safety_identifier: str | None = None  # OpenAI's ``safety_identifier``
    metadata: str | None = None  # the request's ``metadata`` map, as compact JSON
    metered: bool = False  # a usage record was made for a reservation: the ledger will store it
    response_id: str | None = None  # the queued background response this call runs (jobs/background.py)
    # the caller's W3C trace context, the parent of the call's span (gateway/tracing.py)
    traceparent: str | None = None
    key_prefix: str = DEFAULT_KEY_PREFIX  # the form of the gateway's keys: redacted from who the call is for

    @property
    def waited_on(self) -> bool:
        """A caller waits on this call over HTTP: not a batch line, not a background response (those run
        on the gateway's own runners and take no place among the caller's calls in flight)."""
        return self.source == "api" and self.response_id is None

    @property
    def group_id(self) -> int:
        return self.principal.group_id

    @property
    def key_id(self) -> int:
        return self.principal.key_id

    def record(self, model: str, provider: str, stream: bool) -> UsageRecord:
        """The usage record of this call, for a reservation just made (the meter fills in the rest)."""
        self.metered = True
        p = self.principal
        return UsageRecord(
            key_id=p.key_id,
            group_id=p.group_id,
            model=model,
            provider=provider,
            endpoint=self.endpoint,
            source=self.source,
            stream=stream,
            request_id=self.request_id,
            batch_id=self.batch_id,
            end_user=self.end_user,
            safety_identifier=self.safety_identifier,
            metadata=self.metadata,
        )

    def rejected(
        self, exc: GatewayError, model: str, provider: str, stream: bool, began: float
    ) -> UsageRecord:
        """The record of a call refused before anything was reserved: status ``rejected``, no credits,
        the error's code and message (``began``: ``time.perf_counter()`` when the request arrived)."""
        record = self.record(model[:MAX_MODEL], provider, stream)
        record.status = "rejected"
        record.error = exc.message
        record.error_code = exc.code or exc.type
        record.latency_ms = (time.perf_counter() - began) * 1000
        record.ts = time.time()
        return record


def end_user(body: dict[str, Any], key_prefix: str) -> str | None:
    """The end user a request names (OpenAI's ``user``), if it is a string; at most ``MAX_USER``
    characters of it. A key of the gateway's (``key_prefix``) in it is redacted, in ``body`` too."""
    return _named(body, "user", key_prefix)


def identify(context: CallContext, body: dict[str, Any]) -> None:
    """Who the call is for, as the request says (kept on its usage record): ``user``,
    ``safety_identifier`` (at most ``MAX_USER`` characters each) and ``metadata`` (a map of strings, as
    OpenAI takes it: at most 16 pairs, kept as compact JSON of at most ``MAX_METADATA`` characters).

    A key of the gateway's pasted into any of them is redacted (core/redact.py) on the record and in
    ``body`` itself, so it goes neither upstream nor into an answer or a stored response that echoes
    them (a Response object echoes all three)."""
    context.end_user = end_user(body, context.key_prefix)
    if "safety_identifier" in body:
        context.safety_identifier = _named(body, "safety_identifier", context.key_prefix)
    if "metadata" in body:
        context.metadata = _metadata(body, context.key_prefix)


def _named(body: dict[str, Any], name: str, key_prefix: str) -> str | None:
    given = body.get(name)
    if not isinstance(given, str) or not given:
        return None
    if holds_key(given, key_prefix):
        given = body[name] = redact_keys(given, key_prefix)
    return given[:MAX_USER]


def _metadata(body: dict[str, Any], key_prefix: str) -> str | None:
    value = body["metadata"]
    if not isinstance(value, dict) or not value:
        return None
    if any(
        isinstance(v, str) and holds_key(v, key_prefix) or holds_key(k, key_prefix) for k, v in value.items()
    ):
        value = body["metadata"] = {
            redact_keys(k, key_prefix): redact_keys(v, key_prefix) if isinstance(v, str) else v
            for k, v in value.items()
        }
    if len(value) > 16 or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return None
    text = _encode(value).decode()
    return text if len(text) <= MAX_METADATA else None
