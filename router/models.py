"""``GET /v1/models`` and ``GET /v1/models/{id}``: the catalog, encoded once."""

from __future__ import annotations

from decimal import Decimal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from router.catalog import NANO, Catalog, Model
from router.gateway import Gateway
from router.responses import JSONBytes
from router.wire import ModelCard, ModelList, Pricing

_encode = msgspec.json.Encoder().encode


def _credits(nano: int) -> str:
    return format((Decimal(nano) / NANO).normalize(), "f")


def card(catalog: Catalog, model: Model) -> ModelCard:
    return ModelCard(
        id=model.id,
        created=model.created,
        owned_by=catalog.providers[model.provider].owned_by,
        kind=model.kind,
        endpoints=sorted(model.endpoints),
        image_input=model.image_input,
        context_length=model.context,
        max_output_tokens=model.max_output,
        pricing=Pricing(
            input=_credits(model.prices.input),
            output=_credits(model.prices.output),
            cached_input=_credits(model.prices.cached_input),
        ),
        alias_of=model.alias_of,
        shutdown_date=model.shutdown_date,
    )


class Models:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        catalog = gateway.catalog
        self._cards = {m.id: card(catalog, m) for m in catalog.models.values()}
        self._list = _encode(ModelList(data=sorted(self._cards.values(), key=lambda c: c.id)))

    async def list(self, request: Request) -> Response:
        if not self.gw.started:
            await self.gw.start()
        await self.gw.auth.authenticate(request.headers.get("authorization"))
        return JSONBytes(self._list)

    async def retrieve(self, request: Request) -> Response:
        if not self.gw.started:
            await self.gw.start()
        await self.gw.auth.authenticate(request.headers.get("authorization"))
        model = self.gw.catalog.resolve(request.path_params["model"])
        return JSONBytes(_encode(self._cards[model.id]))
