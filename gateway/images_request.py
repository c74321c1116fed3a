"""``POST /v1/images/generations`` and ``/v1/images/edits``, the request: OpenAI's shape, checked
before anything is reserved.

Generations: a JSON body (``prompt``, ``model``, ``n``, ``size``, ``quality``, ...). Edits: a
``multipart/form-data`` body as the OpenAI SDK sends it (``image`` or ``image[]`` files, ``mask``,
and the same fields as text). Output is always ``b64_json``: ``response_format: url`` is a 400 (the
gateway keeps no images to serve by URL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from core.errors import InvalidRequest
from core.inputs import decode_json, natural

MAX_PROMPT = 32_000
QUALITIES = ("auto", "low", "medium", "high")
IMAGE_TYPES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))


def _invalid(message: str, param: str | None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def image_type(data: bytes) -> str | None:
    """The media type of an image's bytes (PNG, JPEG, WEBP), or None if they are not one."""
    for magic, mime in IMAGE_TYPES:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


@dataclass(frozen=True, slots=True)
class Upload:
    field: str  # image, image[] or mask
    filename: str
    mime: str
    data: bytes


@dataclass(slots=True)
class ImagesRequest:
    """One images request: what the caller asked, the fields to pass on (``raw``) and, for edits,
    the uploaded files."""

    model: str
    prompt: str
    n: int
    size: str | None
    quality: str | None
    raw: dict[str, Any]
    files: list[Upload] = field(default_factory=list)

    @property
    def edit(self) -> bool:
        return bool(self.files)


def _fields(raw: dict[str, Any]) -> ImagesRequest:
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _invalid(
            "Missing required parameter: 'prompt' (a non-empty string).",
            "prompt",
            "missing_required_parameter",
        )
    if len(prompt) > MAX_PROMPT:
        raise _invalid(f"'prompt' is longer than {MAX_PROMPT} characters.", "prompt")
    n = raw.get("n", 1)
    if n is None:
        n = 1
    if type(n) is not int or not 1 <= n <= 10:
        raise _invalid("'n' must be an integer from 1 to 10.", "n")
    size = raw.get("size")
    if size is not None and not isinstance(size, str):
        raise _invalid("'size' must be a string such as '1024x1024'.", "size", "invalid_type")
    quality = raw.get("quality")
    if quality is not None and quality not in QUALITIES:
        raise _invalid(f"'quality' must be one of {', '.join(QUALITIES)}.", "quality")
    response_format = raw.get("response_format")
    if response_format == "url":
        raise _invalid(
            "response_format 'url' is not supported: this gateway returns images as b64_json only "
            "(it keeps no images to serve by URL). Omit response_format or send 'b64_json'.",
            "response_format",
            "unsupported_value",
        )
    if response_format not in (None, "b64_json"):
        raise _invalid("'response_format' must be 'b64_json'.", "response_format")
    if raw.get("stream"):
        raise _invalid("Streaming image generation is not supported: remove 'stream'.", "stream")
    return ImagesRequest(model, prompt, n, size, quality, raw)


def parse_generation(body: bytes) -> ImagesRequest:
    raw = decode_json(body)
    if not isinstance(raw, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return _fields(raw)


def _text_value(name: str, value: str) -> Any:
    if name == "n":
        number = natural(value)
        if number is None:
            raise _invalid("'n' must be an integer from 1 to 10.", "n")
        return number
    return value


def parse_edit(body: bytes, content_type: str) -> ImagesRequest:
    """A multipart/form-data edit request: its text fields and files (each checked to be an image)."""
    if "multipart/form-data" not in content_type.lower() or "boundary=" not in content_type:
        raise InvalidRequest(
            "Content-Type must be multipart/form-data with a boundary (as the OpenAI SDK sends images.edit).",
            code="unsupported_content_type",
        )
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise _invalid("The multipart body could not be read.", None, "invalid_multipart")
    raw: dict[str, Any] = {}
    files: list[Upload] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is None and name not in ("image", "image[]", "mask"):
            raw[name] = _text_value(name, data.decode("utf-8", "replace"))
            continue
        if name not in ("image", "image[]", "mask"):
            raise _invalid(f"Unexpected file field '{name}': send 'image' (or 'image[]') and 'mask'.", name)
        mime = image_type(data)
        if mime is None:
            raise _invalid(
                f"The file '{filename or name}' is not a PNG, JPEG or WEBP image.",
                name.rstrip("[]"),
                "invalid_image_format",
            )
        files.append(Upload(name, filename or "image.png", mime, data))
    if not any(f.field != "mask" for f in files):
        raise _invalid(
            "Missing required parameter: 'image' (one or more image files).",
            "image",
            "missing_required_parameter",
        )
    request = _fields(raw)
    request.files = files
    return request
