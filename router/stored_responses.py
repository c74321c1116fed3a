"""The stored responses of ``/v1/responses`` (gateway/response_store.py), as the caller's group sees them:

    GET    /v1/responses/{id}               the Response object (a background one: its status now)
    DELETE /v1/responses/{id}               {"id", "object": "response", "deleted": true}
    GET    /v1/responses/{id}/input_items   its input items, paginated as OpenAI's (after, before,
                                            limit 1-100 default 20, order desc default; has_more,
                                            first_id, last_id)
    POST   /v1/responses/{id}/cancel        a queued or running background response → cancelled

A response of another group, a deleted one and an expired one are the same 404 ``response_not_found``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from billing.store import Principal
from core.errors import InvalidRequest
from gateway.conversation import not_found
from gateway.response_store import Stored
from gateway.state import Gateway
from router.chat import principal_of
from router.files import int_param
from router.logs import trace_of
from router.replies import JSONBytes

_encode = msgspec.json.Encoder().encode
MAX_ID = 256  # characters of a response id (longer: unknown)


class Deleted(msgspec.Struct, omit_defaults=False):
    id: str
    deleted: bool = True
    object: str = "response"


class ItemPage(msgspec.Struct, omit_defaults=False):
    data: list[Any]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


def page(items: list[Any], request: Request) -> ItemPage:
    """One page of ``items`` (each with an ``id``) as the query asks (OpenAI's cursor pagination)."""
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order", code="invalid_value")
    limit = int_param(request, "limit", 20, 1, 100)
    ordered = items[::-1] if order == "desc" else items
    ids = [item.get("id") if isinstance(item, dict) else None for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = request.query_params.get(name)
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidRequest(
                f"'{name}': no input item '{cursor[:MAX_ID]}' in this response.",
                param=name,
                code="invalid_value",
            )
        if name == "after":
            start = ids.index(cursor) + 1
        else:
            end = ids.index(cursor)
    window = ordered[start:end]
    data = window[:limit] if request.query_params.get("before") is None else window[-limit:]
    more = len(window) > len(data)
    return ItemPage(data, data[0].get("id") if data else None, data[-1].get("id") if data else None, more)


class StoredResponses:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def _caller(self, request: Request) -> Principal:
        gw = self.gw
        if not gw.started:
            await gw.start()
        principal = await principal_of(gw, request)
        trace_of(request.scope).caller = principal  # the access log's key and group
        return principal

    async def _stored(self, request: Request) -> tuple[Principal, Stored]:
        principal = await self._caller(request)
        response_id = request.path_params["response_id"]
        found = (
            await self.gw.responses.get(principal.group_id, response_id)
            if len(response_id) <= MAX_ID
            else None
        )
        if found is None:
            raise not_found(response_id[:MAX_ID])
        return principal, found

    async def one(self, request: Request) -> Response:
        if request.method == "DELETE":
            return await self.delete(request)
        _, stored = await self._stored(request)
        return JSONBytes(_encode(stored.response()))

    async def delete(self, request: Request) -> Response:
        principal = await self._caller(request)
        response_id = request.path_params["response_id"]
        if len(response_id) > MAX_ID or not await self.gw.responses.delete(principal.group_id, response_id):
            raise not_found(response_id[:MAX_ID])
        if self.gw.backgrounds is not None:
            self.gw.backgrounds.cancel_background(response_id)  # deleted while it runs here: its call stops
        return JSONBytes(_encode(Deleted(response_id)))

    async def input_items(self, request: Request) -> Response:
        _, stored = await self._stored(request)
        return JSONBytes(_encode(page(stored.input, request)))

    async def cancel(self, request: Request) -> Response:
        principal, stored = await self._stored(request)
        if not stored.background:
            raise InvalidRequest(
                "Cannot cancel a synchronous response: only a response created with "
                "'background: true' can be cancelled.",
                code="response_not_cancellable",
            )
        if stored.status != "cancelled":
            if not await self.gw.responses.cancel(principal.group_id, stored.id):
                raise InvalidRequest(
                    f"Cannot cancel a response that has already ended (status {stored.status}).",
                    code="response_not_cancellable",
                )
            # running here: its call stops now (elsewhere: at the next renewal)
            if self.gw.backgrounds is not None:
                self.gw.backgrounds.cancel_background(stored.id)
            stored.status = "cancelled"
        return JSONBytes(_encode(stored.response()))


def routes(gateway: Gateway) -> list[Route]:
    stored = StoredResponses(gateway)
    return [
        Route("/v1/responses/{response_id}", stored.one, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", stored.input_items, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", stored.cancel, methods=["POST"]),
    ]
