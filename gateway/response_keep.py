"""What ``POST /v1/responses`` keeps of a call: the response, stored once the provider has answered.

    Keep.of(gw, context, body)   the request's storage choices (``store``, ``background``; 400s for what
                                 cannot be stored), before anything is reserved
    keep.echo(previous)          the Response object's fields the gateway decides (id, store, ...)
    keep.answer(response)        store the finished response (a stream's: from its terminal event,
                                 before the caller sees it)
    keep.queue(...)              a background response, queued for jobs/background.py

Nothing is stored for a call that failed before the provider answered (no terminal event, no answer).
If the write of a finished response fails (the store is down, the response is larger than
``[responses] max_stored_bytes``), the call was still settled as any call is (the ledger's own path): the
caller gets the answer with ``store: false``, which says the truth: the id cannot be retrieved or
continued. The failure is logged and counted (``router_store_errors_total{operation="response"}``). A
write whose connection was lost may have committed all the same (the COMMIT was on the wire): the
response is then read back; found, it was stored (``store`` stays true); not found, it was not; the
read failing too, the log says it "may not be stored" and the answer ``store: false``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from billing.tokens import count_request
from core.errors import InvalidRequest
from core.metrics import store_error
from gateway.context import CallContext
from gateway.conversation import Conversation
from gateway.response_store import Encoded, Stored
from gateway.responses_translate import estimate_prompt
from gateway.state import Gateway

log = logging.getLogger("router.responses")
DAY = 86400.0


def _flag(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean.", param=name, code="invalid_type")
    return value


class Keep:
    __slots__ = ("background", "context", "gw", "previous", "running", "store")

    def __init__(self, gw: Gateway, context: CallContext, store: bool, background: bool) -> None:
        self.gw = gw
        self.context = context
        self.store = store
        self.background = background  # asked for by the caller: queue it, answer at once
        self.running = context.response_id  # this call runs a queued background response
        self.previous: str | None = None

    @classmethod
    def of(cls, gw: Gateway, context: CallContext, body: dict[str, Any], size: int) -> Keep:
        store = _flag(body, "store") is not False
        background = bool(_flag(body, "background")) and context.response_id is None
        if background and not store:
            raise InvalidRequest(
                "Background responses are stored to be polled: 'background: true' needs 'store' "
                "true or absent.",
                param="store",
                code="invalid_value",
            )
        if background and body.get("stream"):
            raise InvalidRequest(
                "'background: true' with 'stream: true' is not supported by this gateway: poll the "
                "response with GET /v1/responses/{id}, or stream it in the foreground.",
                param="stream",
                code="unsupported_parameter",
            )
        limit = gw.settings.responses.max_stored_bytes
        if store and size > limit:
            raise InvalidRequest(
                f"The request is {size} bytes, more than this gateway stores for one response ({limit} bytes, "
                "[responses] max_stored_bytes): send it with 'store: false', or shorten it.",
                param="store",
                code="response_too_large",
            )
        return cls(gw, context, store, background)

    def echo(self, conversation: Conversation) -> dict[str, Any]:
        self.previous = conversation.previous
        echo: dict[str, Any] = {"store": self.store, "previous_response_id": conversation.previous}
        if self.running is not None:
            echo["id"], echo["background"] = self.running, True
        return echo

    def check_context(self, conversation: Conversation, size: int) -> None:
        """A conversation grown from stored responses must fit the model's context window (400 naming
        it). A token covers at least one byte, so only one larger than the window in bytes is counted."""
        if not conversation.expanded:
            return
        model = self.gw.catalog.resolve(str(conversation.body["model"]))
        if not model.context or size <= model.context:
            return
        tokens = count_request(estimate_prompt(conversation.body))
        if tokens > model.context:
            param = "previous_response_id" if conversation.previous else "input"
            raise InvalidRequest(
                f"The conversation is about {tokens} tokens with the stored responses it continues, more than the "
                f"context window of `{conversation.body['model']}` ({model.context} tokens); start a new "
                "conversation or send a shorter input.",
                param=param,
                code="context_length_exceeded",
            )

    def stored(self, response: dict[str, Any], conversation: Conversation) -> Stored:
        return Stored(
            id=str(response.get("id")),
            group_id=self.context.group_id,
            key_id=self.context.key_id,
            status=str(response.get("status") or "completed"),
            model=str(response.get("model") or ""),
            created_at=float(response.get("created_at") or time.time()),
            previous_response_id=self.previous,
            body=response,
            input=conversation.own if self.running is None else [],  # (a queued one's: kept)
            output=list(response.get("output") or []),
            background=self.running is not None or self.background,
        )

    async def answer(
        self, response: dict[str, Any], conversation: Conversation, encoded_body: bytes | None = None
    ) -> bool:
        """Store a finished response (``encoded_body``: it, encoded already); on failure it says ``store:
        false`` (see the module's docstring) and this returns False."""
        if not self.store:
            return True
        stored = self.stored(response, conversation)
        encoded = Encoded(stored, encoded_body)
        settings = self.gw.settings.responses
        if encoded.size > settings.max_stored_bytes:
            log.warning("response %s not stored: %d bytes, over max_stored_bytes", stored.id, encoded.size)
            response["store"] = False
            return False
        try:
            if self.running is not None:
                await self.gw.responses.finish(stored, encoded)
            else:
                await self.gw.responses.insert(stored, encoded, time.time() + settings.retention_days * DAY)
        except Exception as exc:  # the store is down, a constraint, a bug: the caller still gets its answer
            store_error("response")
            try:  # (a connection lost while its COMMIT was on the wire: stored or not, unknown until read)
                there = await self.gw.responses.has(stored)
            except Exception:
                there = None
            if there:
                log.warning(
                    "response %s stored, though its write failed (%s: %s)", stored.id, type(exc).__name__, exc
                )
                return True
            log.warning(
                "response %s %s (%s: %s)",
                stored.id,
                "may not be stored" if there is None else "not stored",
                type(exc).__name__,
                exc,
            )
            response["store"] = False
            return False
        return True

    async def queue(self, response: dict[str, Any], conversation: Conversation, request: bytes) -> None:
        """A background response, queued (``request``: the call to run; a failure here is the caller's
        503: nothing was reserved or sent)."""
        stored = self.stored(response, conversation)
        expires = time.time() + self.gw.settings.responses.retention_days * DAY
        await self.gw.responses.insert(stored, Encoded(stored), expires, request)
