"""Validation of a batch input file, before any line runs: pure, no I/O.

Each line of the JSONL is ``{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>",
"body": {...}}``. Every problem found becomes one entry of the batch's ``errors.data`` (OpenAI's
``{"code", "message", "param", "line"}``), with the 1-based line number; any error fails the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from core.errors import GatewayError, InvalidRequest
from core.inputs import decode_json
from core.types import Endpoint
from core.wire import ChatRequest, parse_chat_request
from gateway.embeddings_request import parse_embeddings
from jobs.store import Line

ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}
MAX_ERRORS = 100  # reported per batch (the first ones); the count of the rest is said in the last

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def data(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


Check = Callable[[ChatRequest, Endpoint], None]  # (request, endpoint): raises the GatewayError a call would


def parse_input(
    data: bytes, endpoint: str, check: Check, *, max_lines: int, max_body_bytes: int
) -> tuple[list[Line], list[Problem]]:
    """The lines of a batch input file, or the problems that fail the batch."""
    kind = ENDPOINTS[endpoint]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [Problem("invalid_file", f"The input file is not valid UTF-8 (at byte {exc.start}).")]
    lines: list[Line] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    # not splitlines: U+2028 may sit in a JSON string
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        if len(lines) + len(problems) >= max_lines:
            problems.append(
                Problem("too_many_requests", f"The input file holds more than {max_lines} requests.")
            )
            break
        line, problem = _line(raw, number, endpoint, kind, check, max_body_bytes)
        if problem is None:
            assert line is not None
            first = seen.setdefault(line.custom_id, number)
            if first != number:
                problem = Problem(
                    "duplicate_custom_id",
                    f"The custom_id {line.custom_id!r} is already used on "
                    f"line {first}; each request needs its own.",
                    number,
                    "custom_id",
                )
        if problem is not None:
            problems.append(problem)
        elif line is not None:
            lines.append(line)
    if not lines and not problems:
        problems.append(Problem("empty_file", "The input file holds no requests."))
    if len(problems) > MAX_ERRORS:
        rest = len(problems) - MAX_ERRORS + 1
        problems = [*problems[: MAX_ERRORS - 1], Problem("too_many_errors", f"... and {rest} more errors.")]
    return lines, problems


def _line(
    raw: str, number: int, endpoint: str, kind: Endpoint, check: Check, max_body_bytes: int
) -> tuple[Line | None, Problem | None]:
    try:
        item = decode_json(raw)  # depth-bounded: a line nested 20,000 deep is a problem, not a RecursionError
    except InvalidRequest as exc:
        return None, Problem("invalid_json_line", f"This line is not valid JSON: {exc.message}", number)
    if not isinstance(item, dict):
        return None, Problem("invalid_json_line", "Each line must be a JSON object.", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, Problem(
            "missing_required_parameter",
            "Each request needs a non-empty string 'custom_id'.",
            number,
            "custom_id",
        )
    if item.get("method", "POST") != "POST":
        return None, Problem("invalid_value", "'method' must be 'POST'.", number, "method")
    url = item.get("url")
    if url != endpoint:
        return None, Problem(
            "mismatched_url",
            f"The request's url {url!r} is not the batch's endpoint "
            f"{endpoint!r}; one batch serves one endpoint.",
            number,
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return None, Problem(
            "missing_required_parameter", "Each request needs a JSON object 'body'.", number, "body"
        )
    encoded = _encode(body)
    if len(encoded) > max_body_bytes:
        return None, Problem(
            "request_too_large",
            f"The request body is larger than the limit of {max_body_bytes} bytes.",
            number,
            "body",
        )
    if body.get("stream"):
        return None, Problem(
            "invalid_value", "Batch requests cannot stream: remove 'stream'.", number, "body.stream"
        )
    try:
        if kind == "chat":
            _, request = parse_chat_request(encoded)
        elif kind == "embeddings":
            request = ChatRequest(model=parse_embeddings(body).model, messages=[])
        else:
            model = body.get("model")
            if not isinstance(model, str) or not model:
                return None, Problem(
                    "missing_required_parameter", "Missing required parameter: 'model'.", number, "body.model"
                )
            request = ChatRequest(model=model, messages=[])  # the model, its endpoint, the key's allow-list
        check(request, kind)
    except GatewayError as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        return None, Problem(exc.code or "invalid_request", exc.message, number, param)
    return Line(number, custom_id, encoded.decode()), None
