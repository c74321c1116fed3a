"""``POST /v1/embeddings``, the request: OpenAI's shape, checked before anything is reserved.

``input`` is a string, a list of strings, one token array (a list of integers) or a list of token
arrays; ``dimensions`` a positive integer; ``encoding_format`` ``float`` (default) or ``base64``;
``user`` a string. Other fields are kept (some providers take them: Gemini's ``task_type``,
Mistral's ``output_dtype``). What a given model accepts (its dimensions, how many inputs, token
arrays) is checked per candidate by the codec (:mod:`gateway.embeddings_codec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequest
from core.inputs import decode_json

MAX_DIMENSIONS = 65_536


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _token_array(value: list[Any]) -> bool:
    return bool(value) and all(type(t) is int for t in value)


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """One embeddings request: ``texts`` or ``tokens`` (one of them), what the caller asked of the
    vectors, and the decoded body (``raw``, our own fields removed)."""

    model: str
    texts: list[str] | None
    tokens: list[list[int]] | None
    dimensions: int | None
    base64: bool
    raw: dict[str, Any]

    @property
    def count(self) -> int:
        return len(self.texts) if self.texts is not None else len(self.tokens or ())

    def text(self) -> str:
        """Everything to embed as one text (to estimate its tokens when a provider does not count)."""
        if self.texts is not None:
            return "\n".join(self.texts)
        return ""


def _inputs(value: Any) -> tuple[list[str] | None, list[list[int]] | None]:
    if isinstance(value, str):
        if not value:
            raise _invalid("'input' must not be an empty string.", "input")
        return [value], None
    if not isinstance(value, list):
        raise _invalid(
            "'input' must be a string, a list of strings, or a list of token arrays.", "input", "invalid_type"
        )
    if not value:
        raise _invalid("'input' must not be an empty list.", "input")
    if all(type(t) is int for t in value):
        return None, [value]
    if all(isinstance(t, str) for t in value):
        for i, text in enumerate(value):
            if not text:
                raise _invalid(f"'input[{i}]' must not be an empty string.", f"input[{i}]")
        return value, None
    if all(isinstance(t, list) for t in value):
        for i, tokens in enumerate(value):
            if not _token_array(tokens):
                raise _invalid(
                    f"'input[{i}]' must be a non-empty list of integer token ids.",
                    f"input[{i}]",
                    "invalid_type",
                )
        return None, value
    raise _invalid(
        "'input' must be a string, a list of strings, or a list of token arrays; not a mix.",
        "input",
        "invalid_type",
    )


def parse_embeddings(body: bytes | dict[str, Any]) -> EmbeddingsRequest:
    raw = decode_json(body) if isinstance(body, bytes) else dict(body)
    if not isinstance(raw, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if "input" not in raw:
        raise _invalid("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    texts, tokens = _inputs(raw["input"])
    dimensions = raw.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or not 1 <= dimensions <= MAX_DIMENSIONS):
        raise _invalid("'dimensions' must be a positive integer.", "dimensions")
    encoding = raw.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise _invalid("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    user = raw.get("user")
    if user is not None and not isinstance(user, str):
        raise _invalid("'user' must be a string.", "user", "invalid_type")
    if raw.get("stream"):
        raise _invalid("Embeddings do not stream: remove 'stream'.", "stream")
    return EmbeddingsRequest(model, texts, tokens, dimensions, encoding == "base64", raw)
