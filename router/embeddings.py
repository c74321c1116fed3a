"""``POST /v1/embeddings``: HTTP in, the embeddings codec through the one pipeline, HTTP out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from core.catalog import Catalog
from core.errors import InvalidRequest
from gateway.context import end_user
from gateway.embeddings_codec import EmbeddingsCodec
from gateway.embeddings_request import parse_embeddings
from gateway.pipeline import Pipeline
from gateway.state import Gateway
from router.chat import answered, begin_call


def no_embeddings(catalog: Catalog, model_id: str) -> InvalidRequest | None:
    """A 400 for a model of a group that sells no embedding models (Anthropic): said plainly, rather
    than as a chat model that does not serve this endpoint."""
    try:
        provider = catalog.resolve(model_id).provider
    except Exception:  # ModelNotFound: the pipeline's 404 says it
        return None
    if any(m.provider == provider and "embeddings" in m.endpoints for m in catalog.models.values()):
        return None
    owner = catalog.providers[provider].owned_by.capitalize()
    return InvalidRequest(
        f"{owner} has no embedding models: `{model_id}` cannot serve /v1/embeddings. "
        "GET /v1/models lists the models whose endpoints include 'embeddings'.",
        param="model",
        code="unsupported_model_endpoint",
    )


class Embeddings:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.pipeline = Pipeline(gateway)

    async def handle(self, request: Request) -> Response:
        gw = self.gw
        context, trace, body = await begin_call(gw, request, "embeddings")
        req = parse_embeddings(body)
        trace.model, trace.stream = req.model, False
        context.end_user = end_user(req.raw, context.key_prefix)
        refused = no_embeddings(gw.catalog, req.model)
        if refused is not None:
            raise refused
        codec = EmbeddingsCodec(req, len(body))
        return await answered(self.pipeline, self.pipeline.start(context, codec), trace)
