"""The embeddings codec: ``POST /v1/embeddings`` through the one call lifecycle (gateway/pipeline.py).

Two wires serve it (docs/providers.md, Embeddings):

    OpenAIEmbeddingsLeg   ``POST {base}/embeddings`` — OpenAI (token arrays, ``dimensions``,
                          ``encoding_format`` passed through), Mistral (``dimensions`` →
                          ``output_dimension``; ``output_dtype`` passes), Upstage (text only)
    GeminiEmbeddingsLeg   ``:embedContent`` (one input) or ``:batchEmbedContents`` (several):
                          ``outputDimensionality``, ``taskType`` from the caller's ``task_type``

The answer is always OpenAI's ``list`` of ``embedding`` objects. Vectors are never decoded on the
way (each stays the upstream's JSON text, ``msgspec.Raw``) unless a provider that only answers floats
must be base64-encoded here (little-endian float32, as the OpenAI SDKs decode it) because the caller
asked base64. There is no
output: the worst case reserved is the input, bounded by the body's size (a token id takes at least
one byte of JSON). Gemini's ``:embedContent`` reports no usage: its input is counted here (recorded
as an estimate, ``usage_exact`` false).
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any
from urllib.parse import quote

import msgspec

from adapters.base import USER_AGENT, UpstreamRequest
from adapters.openai import address
from billing import tokens
from core.catalog import EmbeddingSpec, Model
from core.deployments import Deployment
from core.errors import InvalidRequest, UpstreamError
from core.wire import ChatRequest, TokenUsage
from gateway.codec import Answer, Codec, Leg, WholeLeg, fallback_list
from gateway.embeddings_request import EmbeddingsRequest
from gateway.routing import conversation
from gateway.state import Gateway

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
OURS = ("model", "input", "dimensions", "encoding_format", "user", "task_type", "models", "route")


def b64_floats(values: list[float]) -> str:
    """A vector as OpenAI's ``base64`` encoding: little-endian float32 bytes."""
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def check_model(req: EmbeddingsRequest, model: Model, model_id: str) -> EmbeddingSpec:
    """What ``model`` takes against what the request asks (400s naming the field)."""
    spec = model.embedding
    if spec is None:
        raise _invalid(
            f"The model `{model_id}` is not an embedding model.", "model", "unsupported_model_endpoint"
        )
    if req.tokens is not None and not spec.token_arrays:
        raise _invalid(
            f"The model `{model_id}` takes text only; send 'input' as a string or a list of strings, "
            "not token arrays.",
            "input",
            "invalid_type",
        )
    if req.count > spec.max_inputs:
        raise _invalid(
            f"'input' holds {req.count} items; the model `{model_id}` takes at most {spec.max_inputs} "
            "in one request. Split them into several requests.",
            "input",
        )
    if req.dimensions is not None and req.dimensions != spec.dimensions:
        if not spec.max_dimensions:
            raise _invalid(
                f"The model `{model_id}` does not support 'dimensions' (its vectors have {spec.dimensions}).",
                "dimensions",
            )
        if not spec.min_dimensions <= req.dimensions <= spec.max_dimensions:
            raise _invalid(
                f"'dimensions' must be between {spec.min_dimensions} and {spec.max_dimensions} for the "
                f"model `{model_id}` (got {req.dimensions}).",
                "dimensions",
            )
    return spec


class EmbeddingsCodec(Codec):
    endpoint = "embeddings"
    cap_param = "input"

    def __init__(self, req: EmbeddingsRequest, size: int) -> None:
        # no output: the worst case is the input
        view = ChatRequest(model=req.model, messages=[], max_tokens=0)
        super().__init__(view, size, False, fallback_list(req.raw))
        self.req = req

    def conversation(self, key_id: int, first: int) -> bytes:
        return conversation(
            key_id, {"user": self.req.raw.get("user"), "messages": [self.req.raw.get("input")]}, 1
        )

    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> Leg:
        check_model(self.req, model, model_id)
        protocol = gw.catalog.providers[model.provider].protocol
        adapter = gw.adapters[model.provider]
        if protocol == "gemini":
            return GeminiEmbeddingsLeg(self.req, model, model_id, deployment, adapter.error)
        if protocol != "openai":
            raise _invalid(
                f"The model `{model_id}` cannot be called on /v1/embeddings.",
                "model",
                "unsupported_model_endpoint",
            )
        return OpenAIEmbeddingsLeg(self.req, model, model_id, deployment, adapter.error)


class _EmbeddingsLeg(WholeLeg):
    __slots__ = ("req",)

    def __init__(
        self, req: EmbeddingsRequest, model: Model, model_id: str, upstream: UpstreamRequest, map_error: Any
    ) -> None:
        super().__init__(model, model_id, upstream, map_error)
        self.req = req

    @property
    def prompt(self) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": self.req.text()}]}

    def body(self, vectors: list[msgspec.Raw], usage: TokenUsage) -> dict[str, Any]:
        """The caller's answer; each vector stays the upstream's JSON text (never decoded) unless it is
        a float array and the caller asked base64."""
        b64 = self.req.base64
        data = [
            {"object": "embedding", "index": i, "embedding": _b64_raw(v) if b64 else v}
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": self.model_id,
            "usage": {"prompt_tokens": usage.prompt, "total_tokens": usage.prompt},
        }


class _Item(msgspec.Struct):
    embedding: msgspec.Raw
    index: int = 0


class _Reply(msgspec.Struct):
    data: list[_Item]
    usage: dict[str, Any] | None = None


class _Values(msgspec.Struct):
    values: msgspec.Raw


class _GeminiReply(msgspec.Struct):
    embeddings: list[_Values] | None = None
    embedding: _Values | None = None
    usageMetadata: dict[str, Any] | None = None  # noqa: N815 - Gemini's field name


_decode_reply = msgspec.json.Decoder(_Reply).decode
_decode_gemini = msgspec.json.Decoder(_GeminiReply).decode
_decode_floats = msgspec.json.Decoder(list[float]).decode


def _b64_raw(vector: msgspec.Raw) -> Any:
    """A vector as base64: a float array is packed; a string (already base64) is kept."""
    text = bytes(vector)
    if text[:1] != b"[":
        return vector
    return b64_floats(_decode_floats(text))


def _malformed(provider: str) -> UpstreamError:
    return UpstreamError(f"The provider '{provider}' answered embeddings the gateway could not read.")


class OpenAIEmbeddingsLeg(_EmbeddingsLeg):
    """OpenAI, Mistral and Upstage: ``POST {base}/embeddings``."""

    def __init__(
        self, req: EmbeddingsRequest, model: Model, model_id: str, deployment: Deployment, map_error: Any
    ) -> None:
        name = deployment.upstream_name(model)
        provider = model.provider
        body: dict[str, Any] = {"model": name, "input": req.raw["input"]}
        if provider == "openai":  # the rest passes through, as OpenAI takes it
            body.update((k, v) for k, v in req.raw.items() if k not in ("models", "route", "task_type"))
            body["model"] = name
        elif provider == "mistral":
            if req.dimensions is not None:
                body["output_dimension"] = req.dimensions
            for key in ("output_dimension", "output_dtype"):
                if key in req.raw:
                    body[key] = req.raw[key]
        url, headers = address(deployment, "embeddings", name)
        headers |= {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        super().__init__(req, model, model_id, UpstreamRequest(url, headers, _encode(body)), map_error)

    def answer(self, payload: bytes) -> Answer:
        try:
            reply = _decode_reply(payload)
            reported = reply.usage or {}
            usage = TokenUsage(prompt=int(reported.get("prompt_tokens") or 0))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, AttributeError, ValueError):
            raise _malformed(self.model.provider) from None
        items = reply.data
        if any(item.index != i for i, item in enumerate(items)):
            items = sorted(items, key=lambda item: item.index)
        if len(items) != self.req.count:
            raise _malformed(self.model.provider)
        return Answer(self.body([item.embedding for item in items], usage), usage)


class GeminiEmbeddingsLeg(_EmbeddingsLeg):
    """Gemini: ``:embedContent`` for one input, ``:batchEmbedContents`` for several."""

    def __init__(
        self, req: EmbeddingsRequest, model: Model, model_id: str, deployment: Deployment, map_error: Any
    ) -> None:
        if req.texts is None:
            raise _invalid(
                f"The model `{model_id}` takes text only; send 'input' as strings.", "input", "invalid_type"
            )
        name = deployment.upstream_name(model)
        options: dict[str, Any] = {}
        task = req.raw.get("task_type", req.raw.get("taskType"))
        if task is not None:
            if not isinstance(task, str):
                raise _invalid(
                    "'task_type' must be a string (e.g. RETRIEVAL_QUERY).", "task_type", "invalid_type"
                )
            options["taskType"] = task
        if req.dimensions is not None:
            options["outputDimensionality"] = req.dimensions
        requests = [{"content": {"parts": [{"text": text}]}, **options} for text in req.texts]
        if len(requests) == 1:
            method, body = "embedContent", {"model": f"models/{name}", **requests[0]}
        else:
            method, body = (
                "batchEmbedContents",
                {"requests": [{"model": f"models/{name}", **r} for r in requests]},
            )
        url = f"{deployment.base_url}/models/{quote(name, safe='')}:{method}"
        headers = {
            "x-goog-api-key": deployment.api_key,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        super().__init__(req, model, model_id, UpstreamRequest(url, headers, _encode(body)), map_error)

    def answer(self, payload: bytes) -> Answer:
        try:
            reply = _decode_gemini(payload)
            found = (
                reply.embeddings
                if reply.embeddings is not None
                else [reply.embedding]
                if reply.embedding
                else []
            )
            vectors = [item.values for item in found]
            reported = (reply.usageMetadata or {}).get("promptTokenCount")
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, AttributeError):
            raise _malformed(self.model.provider) from None
        if len(vectors) != self.req.count:
            raise _malformed(self.model.provider)
        if isinstance(reported, int):
            usage = TokenUsage(prompt=reported)
            return Answer(self.body(vectors, usage), usage)
        # no usageMetadata (embedContent reports none): counted here, recorded as an estimate
        usage = TokenUsage(prompt=sum(tokens.count(text) for text in self.req.texts or ()))
        return Answer(self.body(vectors, usage), usage, estimated=True)
