"""The images codec: ``POST /v1/images/generations`` and ``/v1/images/edits`` through the one call
lifecycle (gateway/pipeline.py).

    OpenAIImagesLeg   ``POST {base}/images/generations`` (JSON) or ``/images/edits`` (multipart, the
                      files passed on as received); usage as the answer reports it: text and image
                      input tokens, image output tokens
    ImagenLeg         Imagen's ``models/{m}:predict`` (``instances[].prompt``, ``parameters``
                      ``sampleCount`` and ``aspectRatio``); billed per image

The answer is OpenAI's ``{"created", "data": [{"b64_json"}], ...}``. The worst case reserved covers
``n`` images at the largest size asked: for a GPT image model, the output tokens of its largest
image at the quality asked (``high`` when not said), for Imagen ``n`` times its price per image.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from adapters.base import USER_AGENT, UpstreamRequest
from adapters.openai import address
from core.catalog import ImageSpec, Model
from core.deployments import Deployment
from core.errors import InvalidRequest, UpstreamError
from core.wire import ChatRequest, TokenUsage
from gateway.codec import Answer, Codec, Leg, WholeLeg, fallback_list
from gateway.images_request import ImagesRequest
from gateway.routing import conversation
from gateway.state import Gateway

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

# GPT image output tokens per image, by quality and size (OpenAI's image generation guide, the
# gpt-image-1 table); "auto" size may be any of them
IMAGE_TOKENS = {
    "low": {"1024x1024": 272, "1024x1536": 408, "1536x1024": 400},
    "medium": {"1024x1024": 1056, "1024x1536": 1584, "1536x1024": 1568},
    "high": {"1024x1024": 4160, "1024x1536": 6240, "1536x1024": 6208},
}
IMAGE_INPUT_TOKENS = 6_240  # reserved per input image of an edit (its tokens are known only after)
ASPECT = {"1024x1024": "1:1", "896x1280": "3:4", "1280x896": "4:3", "768x1408": "9:16", "1408x768": "16:9"}
NOT_SENT = ("models", "route", "response_format", "stream")


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def check_model(req: ImagesRequest, model: Model, model_id: str) -> ImageSpec:
    spec = model.image
    if spec is None:
        raise _invalid(
            f"The model `{model_id}` does not generate images.", "model", "unsupported_model_endpoint"
        )
    if req.edit and not spec.edits:
        raise _invalid(
            f"The model `{model_id}` does not edit images; POST /v1/images/edits takes a GPT image "
            "model (openai/gpt-image-1.5, ...).",
            "model",
            "unsupported_model_endpoint",
        )
    if req.size is not None and req.size not in spec.sizes:
        raise _invalid(
            f"'size' {req.size!r} is not supported by the model `{model_id}`; it draws "
            f"{', '.join(spec.sizes)}.",
            "size",
        )
    if req.n > spec.max_n:
        raise _invalid(
            f"'n' is {req.n}; the model `{model_id}` draws at most {spec.max_n} image"
            f"{'s' if spec.max_n > 1 else ''} per request.",
            "n",
        )
    return spec


def output_tokens(req: ImagesRequest) -> int:
    """The most output tokens one GPT image of this request can cost."""
    table = IMAGE_TOKENS.get(req.quality or "high", IMAGE_TOKENS["high"])
    return table.get(req.size or "auto", max(table.values()))


class ImagesCodec(Codec):
    endpoint = "images"
    image_param = "image"
    cap_param = "n"

    def __init__(self, req: ImagesRequest, size: int) -> None:
        view = ChatRequest(model=req.model, messages=[], max_tokens=output_tokens(req), n=req.n)
        pictures = sum(1 for f in req.files if f.field != "mask")
        prompt_bytes = len(req.prompt.encode()) + 256  # the prompt and the other fields
        super().__init__(
            view,
            prompt_bytes + pictures * IMAGE_INPUT_TOKENS if req.edit else size,
            False,
            fallback_list(req.raw),
        )
        self.req = req

    def conversation(self, key_id: int, first: int) -> bytes:
        return conversation(key_id, {"user": self.req.raw.get("user"), "messages": [self.req.prompt]}, 1)

    def leg(self, gw: Gateway, model: Model, model_id: str, deployment: Deployment) -> Leg:
        check_model(self.req, model, model_id)
        protocol = gw.catalog.providers[model.provider].protocol
        error = gw.adapters[model.provider].error
        if protocol == "gemini":
            return ImagenLeg(self.req, model, model_id, deployment, error)
        if protocol == "openai":
            return OpenAIImagesLeg(self.req, model, model_id, deployment, error)
        raise _invalid(
            f"The model `{model_id}` cannot be called on /v1/images.", "model", "unsupported_model_endpoint"
        )


class _ImagesLeg(WholeLeg):
    __slots__ = ("req",)

    def __init__(
        self, req: ImagesRequest, model: Model, model_id: str, upstream: UpstreamRequest, map_error: Any
    ) -> None:
        super().__init__(model, model_id, upstream, map_error)
        self.req = req

    @property
    def prompt(self) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": self.req.prompt}]}


def _malformed(provider: str) -> UpstreamError:
    return UpstreamError(f"The provider '{provider}' answered images the gateway could not read.")


def multipart(fields: dict[str, Any], req: ImagesRequest) -> tuple[bytes, str]:
    """The edit request as multipart/form-data: its text fields, then its files as received."""
    boundary = "router-" + secrets.token_hex(12)
    out: list[bytes] = []
    for name, value in fields.items():
        text = value if isinstance(value, str) else _encode(value).decode()
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{text}\r\n'.encode()
        )
    for upload in req.files:
        filename = upload.filename.replace('"', "")
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{upload.field}"; filename="{filename}"\r\n'
            f"Content-Type: {upload.mime}\r\n\r\n".encode()
            + upload.data
            + b"\r\n"
        )
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


class OpenAIImagesLeg(_ImagesLeg):
    def __init__(
        self, req: ImagesRequest, model: Model, model_id: str, deployment: Deployment, map_error: Any
    ) -> None:
        fields = {k: v for k, v in req.raw.items() if k not in NOT_SENT}
        name = fields["model"] = deployment.upstream_name(model)
        url, headers = address(deployment, "images/edits" if req.edit else "images/generations", name)
        headers["User-Agent"] = USER_AGENT
        if req.edit:
            body, headers["Content-Type"] = multipart(fields, req)
        else:
            body, headers["Content-Type"] = _encode(fields), "application/json"
        super().__init__(req, model, model_id, UpstreamRequest(url, headers, body), map_error)

    def answer(self, payload: bytes) -> Answer:
        try:
            data = _decode(payload)
            images = data["data"]
            reported = data.get("usage") or {}
            details = reported.get("input_tokens_details") or {}
            usage = TokenUsage(
                prompt=int(reported.get("input_tokens") or 0),
                image_prompt=int(details.get("image_tokens") or 0),
                completion=int(reported.get("output_tokens") or 0),
            )
        except (msgspec.DecodeError, KeyError, TypeError, AttributeError, ValueError):
            raise _malformed(self.model.provider) from None
        if not isinstance(images, list) or not all(isinstance(i, dict) and "b64_json" in i for i in images):
            raise _malformed(self.model.provider)
        if not reported:  # no usage in the answer: the worst case of what was drawn, marked as an estimate
            usage = TokenUsage(prompt=len(self.req.prompt), completion=len(images) * output_tokens(self.req))
            return Answer(data, usage, estimated=True)
        return Answer(data, usage)


class ImagenLeg(_ImagesLeg):
    """Imagen on the Gemini API: ``models/{m}:predict``."""

    def __init__(
        self, req: ImagesRequest, model: Model, model_id: str, deployment: Deployment, map_error: Any
    ) -> None:
        name = deployment.upstream_name(model)
        parameters: dict[str, Any] = {"sampleCount": req.n}
        if req.size is not None:
            parameters["aspectRatio"] = ASPECT[req.size]
        body = {"instances": [{"prompt": req.prompt}], "parameters": parameters}
        url = f"{deployment.base_url}/models/{name}:predict"
        headers = {
            "x-goog-api-key": deployment.api_key,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        super().__init__(req, model, model_id, UpstreamRequest(url, headers, _encode(body)), map_error)

    def answer(self, payload: bytes) -> Answer:
        try:
            found = _decode(payload).get("predictions") or []
            images = [p["bytesBase64Encoded"] for p in found if "bytesBase64Encoded" in p]
        except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
            raise _malformed(self.model.provider) from None
        # Imagen bills per image drawn (filtered ones are not returned, nor billed)
        body = {
            "created": int(time.time()),
            "data": [{"b64_json": image} for image in images],
            "size": self.req.size or "1024x1024",
            "output_format": "png",
        }
        return Answer(body, TokenUsage(images=len(images)))
