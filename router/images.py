"""``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (multipart): HTTP in, the
images codec through the one pipeline, HTTP out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import CallContext, end_user
from gateway.images_codec import ImagesCodec
from gateway.images_request import ImagesRequest, parse_edit, parse_generation
from gateway.pipeline import Pipeline
from gateway.state import Gateway
from router.chat import answered, begin_call
from router.logs import Trace


class Images:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def generations(self, request: Request) -> Response:
        context, trace, body = await begin_call(self.gw, request, "images")
        trace.stream = False
        return await self._call(context, trace, parse_generation(body), len(body))

    async def edits(self, request: Request) -> Response:
        context, trace, body = await begin_call(self.gw, request, "images", json=False)
        trace.stream = False
        return await self._call(
            context, trace, parse_edit(body, request.headers.get("content-type", "")), len(body)
        )

    async def _call(self, context: CallContext, trace: Trace, req: ImagesRequest, size: int) -> Response:
        trace.model = req.model
        context.end_user = end_user(req.raw, context.key_prefix)
        codec = ImagesCodec(req, size)
        return await answered(self.pipeline, self.pipeline.start(context, codec), trace)
