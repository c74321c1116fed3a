"""``POST /v1/messages/count_tokens`` served: Anthropic's own count for a model its provider serves in
Anthropic's protocol, sent as every call is (gateway/reliability.py ``open_upstream``: the deployments'
order, failing over between them, retries within the deadline, the circuit breakers: an open circuit is
``circuit_open`` at once); elsewhere the gateway's tokenizer's estimate. Checked and rate-limited like a
call; never reserved, billed nor recorded.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple

import msgspec

from adapters.anthropic import messages as native
from adapters.base import map_upstream_error
from billing import tokens
from billing.store import Principal
from core.errors import UpstreamError
from core.types import Headers
from gateway.messages_codec import MessagesCodec
from gateway.messages_translate import to_chat
from gateway.pipeline import Pipeline
from gateway.reliability import UpstreamCall, open_upstream
from gateway.routing import Ask
from gateway.state import Gateway


class Count(NamedTuple):
    input_tokens: int
    source: str  # "provider" (the upstream counted) or "estimate" (the gateway's tokenizer)
    rate_headers: Headers | None  # the caller's rate limits, as any call's answer says them


async def count_tokens(
    gw: Gateway, principal: Principal, body: dict[str, Any], size: int, sent: dict[str, str]
) -> Count:
    """The input tokens of the Messages request ``body`` (``size`` bytes; ``sent``: the caller's
    ``anthropic-version`` and ``anthropic-beta``) for ``principal``."""
    codec = MessagesCodec(body, size, sent)
    model = Pipeline(gw).check(principal, codec.view, "messages", cap_param="max_tokens")
    headers = await gw.limits.admit(principal, model, codec.size, codec.view)
    if gw.catalog.providers[model.provider].protocol != "anthropic":
        return Count(tokens.count_request(to_chat({**body, "stream": False})), "estimate", headers)
    deadline = time.monotonic() + gw.settings.reliability.deadline
    call = UpstreamCall(
        model,
        codec.deployments(gw, model),
        lambda dep: native.count_request(dep, body, dep.upstream_name(model), sent),
        partial(map_upstream_error, model.provider),
        deadline,
        principal.group_id,
        Ask(stream=False),
    )
    response, lease = await open_upstream(gw, call)
    try:
        payload = await response.read()
    finally:
        response.release()
        lease.end()
    try:
        count = msgspec.json.decode(payload)["input_tokens"]
    except (msgspec.DecodeError, KeyError, TypeError):
        raise UpstreamError(f"The provider '{model.provider}' returned an unexpected count.") from None
    return Count(count, "provider", headers)
