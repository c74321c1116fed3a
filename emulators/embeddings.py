"""Embeddings as the providers serve them: ``POST /v1/embeddings`` for OpenAI, Mistral and Upstage
(:class:`OpenAIEmbeddings`, one per :class:`emulators.openai.OpenAIEmulator`) and Gemini's
``:embedContent`` / ``:batchEmbedContents`` (:func:`gemini_embed`).

Vectors are deterministic (the same input and size give the same unit vector: SHAKE-256 of the
input), of the model's size or the one asked; usage as each provider reports it. The fault
directives of the chat emulators apply to the inputs' text ([fault:N], [slow:MS], [malformed],
[flaky:N], [limited:N]).
"""

from __future__ import annotations

import base64
import hashlib
import math
import sys
from array import array
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aiohttp import web

from emulators.common import encode, pause, random_id
from emulators.directives import count_tokens, directives
from emulators.host import Host

# model -> (default size, largest size a caller may ask; 0: only the default)
MODELS: dict[str, dict[str, tuple[int, int]]] = {
    "openai": {
        "text-embedding-3-small": (1536, 1536),
        "text-embedding-3-large": (3072, 3072),
        "text-embedding-ada-002": (1536, 0),
    },
    "mistral": {"mistral-embed": (1024, 0), "codestral-embed": (1536, 3072)},
    "upstage": {
        "embedding-query": (4096, 0),
        "embedding-passage": (4096, 0),
        "solar-embedding-1-large-query": (4096, 0),
        "solar-embedding-1-large-passage": (4096, 0),
    },
    "google": {"gemini-embedding-001": (3072, 3072), "text-embedding-004": (768, 768)},
}
MAX_INPUTS = {"openai": 2048, "mistral": 512, "upstage": 100, "google": 100}
MISTRAL_FIELDS = frozenset(
    {"model", "input", "output_dimension", "output_dtype", "encoding_format", "metadata"}
)


@lru_cache(maxsize=4096)
def vector(seed: str, size: int) -> tuple[float, ...]:
    """A unit vector of ``size`` drawn from ``seed``: the same seed and size, the same vector."""
    raw = array("h", hashlib.shake_256(seed.encode()).digest(2 * size))
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return tuple(x / norm for x in raw)


def b64(values: tuple[float, ...]) -> str:
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def seed_of(item: Any) -> str:
    return item if isinstance(item, str) else "tokens:" + ",".join(map(str, item))


class OpenAIEmbeddings:
    """``POST /v1/embeddings`` of an OpenAI-compatible emulator, in its flavour."""

    def __init__(self, emu: Host) -> None:
        self.emu = emu
        self.flavour = emu.flavour

    def _invalid(self, message: str, param: str | None = None) -> web.Response:
        if self.flavour == "mistral":
            detail = [{"type": "value_error", "loc": ["body", param or "input"], "msg": message}]
            return web.Response(status=422, body=encode({"detail": detail}), content_type="application/json")
        return self.emu.error(400, message, "invalid_request_error", "invalid_value")

    def _inputs(self, body: dict[str, Any]) -> list[Any] | web.Response:
        value = body.get("input")
        if isinstance(value, str):
            value = [value]
        elif isinstance(value, list) and value and all(type(t) is int for t in value):
            value = [value]
        if not isinstance(value, list) or not value:
            return self._invalid("'input' must be a non-empty string or array.", "input")
        text_only = self.flavour != "openai"
        for item in value:
            if isinstance(item, str) and item:
                continue
            if not text_only and isinstance(item, list) and item and all(type(t) is int for t in item):
                continue
            return self._invalid("'$.input' is invalid. Please check the API reference.", "input")
        if len(value) > MAX_INPUTS[self.flavour]:
            return self._invalid(f"Too many inputs: at most {MAX_INPUTS[self.flavour]} per request.", "input")
        return value

    def _size(self, body: dict[str, Any], model: str) -> int | web.Response:
        default, largest = MODELS[self.flavour][model]
        asked = body.get("output_dimension" if self.flavour == "mistral" else "dimensions")
        if asked is None or self.flavour == "upstage":
            return default
        if not largest:
            return self._invalid("This model does not support specifying dimensions.", "dimensions")
        if type(asked) is not int or not 1 <= asked <= largest:
            return self._invalid(f"Invalid value for dimensions: {asked}; at most {largest}.", "dimensions")
        return asked

    async def handle(self, request: web.Request) -> web.StreamResponse:
        emu = self.emu
        if not emu._authorised(request):
            return emu.error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        body = await emu.body(request)
        if isinstance(body, web.Response):
            return body
        if (wait := emu.over_limit()) is not None:
            return emu.rate_limited(wait)
        if self.flavour == "mistral" and (extra := sorted(set(body) - MISTRAL_FIELDS)):
            detail = [
                {"type": "extra_forbidden", "loc": ["body", f], "msg": "Extra inputs are not permitted"}
                for f in extra
            ]
            return web.Response(status=422, body=encode({"detail": detail}), content_type="application/json")
        model = body.get("model")
        if model not in MODELS[self.flavour]:
            return emu.error(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            )
        inputs = self._inputs(body)
        if isinstance(inputs, web.Response):
            return inputs
        size = self._size(body, model)
        if isinstance(size, web.Response):
            return size
        text = " ".join(i for i in inputs if isinstance(i, str))
        d = directives(text)
        await pause(d.slow_ms)
        flaky = emu.flakiness.fault("embeddings:" + text, d)
        if flaky == 429:
            return emu.error(
                429,
                "Rate limit reached for requests",
                "requests",
                "rate_limit_exceeded",
                {"retry-after": "0.1"},
            )
        if d.fault == 402 and self.flavour != "openai":
            d.fault = None
        if d.fault or flaky:
            return emu.fault(d.fault or flaky or 500)
        if d.malformed:
            return web.Response(body=b'{"object": "list", "data": [', content_type="application/json")
        as_b64 = self.flavour == "openai" and body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(inputs):
            values = vector(f"{model}:{seed_of(item)}", size)
            data.append({"object": "embedding", "index": i, "embedding": b64(values) if as_b64 else values})
        tokens = sum(count_tokens(i) if isinstance(i, str) else len(i) for i in inputs)
        usage: dict[str, Any] = {"prompt_tokens": tokens, "total_tokens": tokens}
        out: dict[str, Any] = {"object": "list", "data": data, "model": model, "usage": usage}
        if self.flavour == "mistral":
            usage["completion_tokens"] = 0
            out = {"id": random_id(32, "0123456789abcdef"), **out}
        return web.Response(
            body=encode(out),
            content_type="application/json",
            headers={"x-request-id": "req_" + random_id(16)},
        )


def _gemini_error(code: int, message: str, status: str = "INVALID_ARGUMENT") -> web.Response:
    return web.Response(
        status=code,
        body=encode({"error": {"code": code, "message": message, "status": status}}),
        content_type="application/json",
    )


def _gemini_one(model: str, request: Any) -> tuple[tuple[float, ...], str] | str:
    """One EmbedContentRequest → its vector and text, or what is wrong with it."""
    if not isinstance(request, dict):
        return "Invalid JSON payload received. Expected an object."
    content = request.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not parts:
        return "* EmbedContentRequest.content: contents must not be empty"
    text = " ".join(p.get("text", "") for p in parts if isinstance(p, dict))
    if not text.strip():
        return "* EmbedContentRequest.content: contents must not be empty"
    default, largest = MODELS["google"][model]
    size = request.get("outputDimensionality", request.get("output_dimensionality")) or default
    if type(size) is not int or not 1 <= size <= largest:
        return f"* EmbedContentRequest.output_dimensionality: must be at most {largest}"
    task = request.get("taskType")
    return vector(f"{model}:{task or ''}:{text}", size), text


async def gemini_embed(
    model: str, method: str, body: dict[str, Any], fault: Callable[[int], web.Response]
) -> web.Response:
    """``models/{model}:embedContent`` and ``:batchEmbedContents`` (authorised and rate-limited by
    the caller, :class:`emulators.gemini.GeminiEmulator`)."""
    if model not in MODELS["google"]:
        return _gemini_error(
            404,
            f"models/{model} is not found for API version v1beta, or is not supported for "
            f"{method}. Call ListModels to see the list of available models and their supported "
            "methods.",
            "NOT_FOUND",
        )
    requests = body.get("requests") if method == "batchEmbedContents" else [body]
    if not isinstance(requests, list) or not requests:
        return _gemini_error(400, "* BatchEmbedContentsRequest.requests: must not be empty")
    if len(requests) > MAX_INPUTS["google"]:
        return _gemini_error(
            400, "* BatchEmbedContentsRequest.requests: at most 100 requests can be in one batch"
        )
    found = [_gemini_one(model, r) for r in requests]
    wrong = next((f for f in found if isinstance(f, str)), None)
    if wrong is not None:
        return _gemini_error(400, wrong)
    texts = [f[1] for f in found if not isinstance(f, str)]
    d = directives(" ".join(texts))
    await pause(d.slow_ms)
    if d.fault:
        return fault(d.fault)
    if d.malformed:
        return web.Response(body=b'{"embeddings": [{"values": [0.1,', content_type="application/json")
    vectors = [{"values": f[0]} for f in found if not isinstance(f, str)]
    if method == "embedContent":  # the single call reports no usage
        return web.Response(body=encode({"embedding": vectors[0]}), content_type="application/json")
    usage = {"promptTokenCount": sum(count_tokens(t) for t in texts)}
    return web.Response(
        body=encode({"embeddings": vectors, "usageMetadata": usage}), content_type="application/json"
    )
