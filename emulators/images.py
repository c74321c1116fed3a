"""Image generation as the providers serve it: OpenAI's ``POST /v1/images/generations`` (JSON) and
``/v1/images/edits`` (multipart) for the GPT image models (:class:`OpenAIImages`), and Imagen's
``models/{m}:predict`` on the Gemini API (:func:`imagen_predict`).

Images are real PNGs of the size asked, one colour drawn from the prompt (the same prompt, the same
image). Usage as each reports it: OpenAI's ``input_tokens`` (text and image), ``output_tokens`` by
quality and size (its gpt-image-1 table); Imagen reports none. The fault words of the chat emulators
apply to the prompt ([fault:N], [slow:MS], [malformed]).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import zlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aiohttp import BodyPartReader, web

from emulators.common import DEPLOYED, encode, pause, random_id
from emulators.directives import count_tokens, directives
from emulators.host import Host

GPT_IMAGE = ("gpt-image-1", "gpt-image-1-mini", "gpt-image-1.5")
GPT_SIZES = {
    "auto": (1024, 1024),
    "1024x1024": (1024, 1024),
    "1536x1024": (1536, 1024),
    "1024x1536": (1024, 1536),
}
OUTPUT_TOKENS = {
    "low": {"1024x1024": 272, "1024x1536": 408, "1536x1024": 400},
    "medium": {"1024x1024": 1056, "1024x1536": 1584, "1536x1024": 1568},
    "high": {"1024x1024": 4160, "1024x1536": 6240, "1536x1024": 6208},
}
IMAGEN = ("imagen-4.0-generate-001", "imagen-4.0-fast-generate-001", "imagen-4.0-ultra-generate-001")
ASPECTS = {
    "1:1": (1024, 1024),
    "3:4": (896, 1280),
    "4:3": (1280, 896),
    "9:16": (768, 1408),
    "16:9": (1408, 768),
}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


@lru_cache(maxsize=64)
def png(width: int, height: int, colour: tuple[int, int, int]) -> bytes:
    """A real PNG (8-bit RGB) of ``width`` x ``height`` in one colour."""
    row = b"\x00" + bytes(colour) * width
    pixels = zlib.compress(row * height, 1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", pixels) + _chunk(b"IEND", b"")


def drawn(prompt: str, width: int, height: int, index: int = 0) -> str:
    """The base64 PNG the prompt draws (its colour from the prompt and the image's index)."""
    digest = hashlib.sha256(f"{index}:{prompt}".encode()).digest()
    return base64.b64encode(png(width, height, (digest[0], digest[1], digest[2]))).decode()


class OpenAIImages:
    """The GPT image endpoints of :class:`emulators.openai.OpenAIEmulator` (flavour openai)."""

    def __init__(self, emu: Host) -> None:
        self.emu = emu

    def _invalid(self, message: str, param: str) -> web.Response:
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": "invalid_value",
            }
        }
        return web.Response(status=400, body=encode(body), content_type="application/json")

    async def generations(self, request: web.Request) -> web.StreamResponse:
        if not self.emu._authorised(request):
            return self.emu.error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        body = await self.emu.body(request)
        if isinstance(body, web.Response):
            return body
        return await self._answer(body, 0)

    async def edits(self, request: web.Request) -> web.StreamResponse:
        if not self.emu._authorised(request):
            return self.emu.error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        if not request.content_type.startswith("multipart/"):
            return self._invalid("Invalid Content-Type header, expected multipart/form-data.", "image")
        fields: dict[str, Any] = {}
        image_tokens = 0
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            data = await part.read()
            if part.filename is None:
                fields[part.name] = data.decode()
            elif part.name in ("image", "image[]"):
                if not data.startswith((b"\x89PNG", b"\xff\xd8\xff")) and data[8:12] != b"WEBP":
                    return self._invalid(
                        "Invalid image file or mode for image 1, please check your image file.", "image"
                    )
                image_tokens += 323  # a 1024x1024 input image at low fidelity
        if not image_tokens:
            return self._invalid("Missing required parameter: 'image'.", "image")
        if DEPLOYED in request:  # under Azure's URL shape the deployment names the model
            fields["model"] = request[DEPLOYED]
        if "n" in fields:
            try:
                fields["n"] = int(fields["n"])
            except ValueError:
                return self._invalid("Invalid type for 'n': expected an integer.", "n")
        self.emu.received(fields)
        return await self._answer(fields, image_tokens)

    async def _answer(self, body: dict[str, Any], image_tokens: int) -> web.StreamResponse:
        emu = self.emu
        if (wait := emu.over_limit()) is not None:
            return emu.rate_limited(wait)
        model = body.get("model")
        if model not in GPT_IMAGE:
            return emu.error(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            )
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return self._invalid("Missing required parameter: 'prompt'.", "prompt")
        size = body.get("size") or "auto"
        if size not in GPT_SIZES:
            return self._invalid(
                f"Invalid value: '{size}'. Supported values are: '1024x1024', '1024x1536', "
                "'1536x1024', and 'auto'.",
                "size",
            )
        n = body.get("n") or 1
        if type(n) is not int or not 1 <= n <= 10:
            return self._invalid("Invalid value for 'n': must be between 1 and 10.", "n")
        if "response_format" in body:
            return self._invalid("Unknown parameter: 'response_format'.", "response_format")
        d = directives(prompt)
        await pause(d.slow_ms)
        if d.fault:
            return emu.fault(d.fault)
        if d.malformed:
            return web.Response(
                body=b'{"created": 1, "data": [{"b64_json": "iVBOR', content_type="application/json"
            )
        quality = body.get("quality") or "auto"
        tier = "medium" if quality == "auto" else quality
        width, height = GPT_SIZES[size]
        named = "1024x1024" if size == "auto" else size
        text_tokens = count_tokens(prompt)
        output = OUTPUT_TOKENS.get(tier, OUTPUT_TOKENS["medium"])[named] * n
        out = {
            "created": int(time.time()),
            "background": "opaque",
            "data": [{"b64_json": drawn(prompt, width, height, i)} for i in range(n)],
            "output_format": "png",
            "quality": tier,
            "size": named,
            "usage": {
                "input_tokens": text_tokens + image_tokens,
                "input_tokens_details": {"image_tokens": image_tokens, "text_tokens": text_tokens},
                "output_tokens": output,
                "total_tokens": text_tokens + image_tokens + output,
            },
        }
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


async def imagen_predict(
    model: str, body: dict[str, Any], fault: Callable[[int], web.Response]
) -> web.Response:
    """``models/{model}:predict`` for Imagen (authorised and rate-limited by the Gemini emulator)."""
    if model not in IMAGEN:
        return _gemini_error(
            404,
            f"models/{model} is not found for API version v1beta, or is not supported for "
            "predict. Call ListModels to see the list of available models and their supported "
            "methods.",
            "NOT_FOUND",
        )
    instances = body.get("instances")
    prompt = (
        instances[0].get("prompt")
        if isinstance(instances, list) and instances and isinstance(instances[0], dict)
        else None
    )
    if not isinstance(prompt, str) or not prompt.strip():
        return _gemini_error(400, "* PredictRequest.instances[0].prompt: must not be empty")
    parameters = body.get("parameters") or {}
    n = parameters.get("sampleCount", 4)
    most = 1 if "ultra" in model else 4
    if type(n) is not int or not 1 <= n <= most:
        return _gemini_error(400, f"Number of images must be in the range [1, {most}].")
    aspect = parameters.get("aspectRatio", "1:1")
    if aspect not in ASPECTS:
        return _gemini_error(400, f"Unsupported aspect ratio: {aspect}. Supported: {', '.join(ASPECTS)}.")
    d = directives(prompt)
    await pause(d.slow_ms)
    if d.fault:
        return fault(d.fault)
    if d.malformed:
        return web.Response(body=b'{"predictions": [{"bytesBase64', content_type="application/json")
    width, height = ASPECTS[aspect]
    predictions = [
        {"bytesBase64Encoded": drawn(prompt, width, height, i), "mimeType": "image/png"} for i in range(n)
    ]
    return web.Response(body=encode({"predictions": predictions}), content_type="application/json")


__all__ = ["OpenAIImages", "imagen_predict", "png"]
