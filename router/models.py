"""``GET /v1/models`` and ``GET /v1/models/{id}``: the catalog, encoded once."""

from __future__ import annotations

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from core.catalog import Catalog, Model, not_found
from core.money import to_credits
from core.wire import ModelCard, ModelList, Pricing
from gateway.auth import may_use
from gateway.state import Gateway
from router.replies import JSONBytes

_encode = msgspec.json.Encoder().encode


def card(catalog: Catalog, model: Model) -> ModelCard:
    prices = model.prices
    return ModelCard(
        id=model.id,
        created=model.created,
        owned_by=catalog.providers[model.provider].owned_by,
        kind=model.kind,
        endpoints=sorted(model.endpoints),
        image_input=model.image_input,
        tools=model.tools
        and not model.endpoints.isdisjoint(("chat", "responses")),  # (not embeddings, images)
        context_length=model.context,
        max_output_tokens=model.max_output,
        pricing=Pricing(
            input=to_credits(prices.input),
            output=to_credits(prices.output),
            cached_input=to_credits(prices.cached_input),
            cache_write=UNSET if prices.cache_write == prices.input else to_credits(prices.cache_write),
            cache_write_1h=UNSET
            if prices.cache_write_1h == prices.cache_write
            else to_credits(prices.cache_write_1h),
            image_input=UNSET if prices.image_input == prices.input else to_credits(prices.image_input),
            image=to_credits(prices.image) if prices.image else UNSET,
        ),
        alias_of=model.alias_of,
        shutdown_date=model.shutdown_date,
    )


class Models:
    """A key with an allow-list sees only the models it may call (its list is encoded once per list)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self._catalog = gateway.catalog
        self._cards = {m.id: card(self._catalog, m) for m in self._catalog.models.values()}
        self._lists: dict[frozenset[str] | None, bytes] = {None: self._encode(None)}

    def _fresh(self) -> None:
        """The cards again after a reload changed the catalog (gateway.state.Gateway.reload)."""
        if self.gw.catalog is not self._catalog:
            self._catalog = self.gw.catalog
            self._cards = {m.id: card(self._catalog, m) for m in self._catalog.models.values()}
            self._lists = {None: self._encode(None)}

    def _encode(self, allowed: frozenset[str] | None) -> bytes:
        cards = [c for c in self._cards.values() if allowed is None or c.id in allowed]
        return _encode(ModelList(data=sorted(cards, key=lambda c: c.id)))

    async def list(self, request: Request) -> Response:
        if not self.gw.started:
            await self.gw.start()
        allowed = (await self.gw.auth.authenticate(request.headers.get("authorization"))).allowed_models
        self._fresh()
        body = self._lists.get(allowed)
        if body is None:
            if len(self._lists) > 10_000:
                self._lists = {None: self._lists[None]}
            body = self._lists[allowed] = self._encode(allowed)
        return JSONBytes(body)

    async def retrieve(self, request: Request) -> Response:
        if not self.gw.started:
            await self.gw.start()
        principal = await self.gw.auth.authenticate(request.headers.get("authorization"))
        self._fresh()
        asked = request.path_params["model"]
        model = self.gw.catalog.resolve(asked)
        if not may_use(principal, model.id, asked):
            raise not_found(asked)  # as OpenAI answers for a model the key cannot see
        found = self._cards[model.id]
        if asked != model.id:  # the id sent is the id answered (claude/... stays claude/...)
            found = msgspec.structs.replace(found, id=asked)
        return JSONBytes(_encode(found))
