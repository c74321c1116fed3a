"""One batch line as one in-process HTTP call to the gateway's own app, and its line in the output or
error file.

The call goes through the app exactly as an HTTP request would (routes, the chat pipeline or the
Responses endpoint, the ledger), its caller and ``source=job`` given by the :class:`CallContext` put in
``scope["state"]`` (gateway/context.py) instead of a key; nothing of it is reimplemented here. Output lines are in the OpenAI Batch format::

    {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
     "body": {...}}, "error": null}

and error lines carry ``"error": {"code", "message"}`` (with ``response`` when an HTTP answer exists).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import msgspec

from core.types import ASGIApp, Message
from gateway.context import CONTEXT, CallContext
from jobs.store import Outcome, Tokens

# numbers with a fraction are kept as written (Decimal in, the same digits out): ``usage.cost`` is an
# exact decimal and must reach the output line as the answer gave it
_decode = msgspec.json.Decoder(float_hook=Decimal).decode
_encode = msgspec.json.Encoder(decimal_format="number").encode


class Response(msgspec.Struct, omit_defaults=False):
    status_code: int
    request_id: str
    body: Any


class Error(msgspec.Struct, omit_defaults=False):
    code: str
    message: str


class OutputLine(msgspec.Struct, omit_defaults=False):
    id: str
    custom_id: str
    response: Response | None
    error: Error | None


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]


def request_id() -> str:
    return "req_" + secrets.token_hex(12)


async def call_app(app: ASGIApp, path: str, body: bytes, context: CallContext) -> Answer:
    """POST ``body`` to ``path`` of ``app`` in-process, as the call ``context`` says (``source=job``)."""
    rid = context.request_id or ""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"batch.internal"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", rid.encode()),
        ],
        "client": None,
        "server": None,
        "state": {CONTEXT: context},
    }
    sent = False
    answered = asyncio.Event()  # the "client" stays connected until the whole answer is sent
    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers.update(
                (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in message.get("headers", ())
            )
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception:  # the app answered 500 (its error handler) and re-raised: keep its answer
        if not status:
            raise
    return Answer(status, b"".join(chunks), headers)


def line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def output_line(custom_id: str, rid: str, answer: Answer) -> Outcome:
    """A call's answer as its output line (2xx) or error line (any other status)."""
    try:
        body: Any = _decode(answer.body) if answer.body else None
    except msgspec.DecodeError:
        body = {"error": {"message": "The gateway's answer was not JSON.", "type": "server_error"}}
    if 200 <= answer.status < 300 and isinstance(body, dict):
        line = OutputLine(line_id(), custom_id, Response(answer.status, rid, body), None)
        return Outcome(True, _encode(line).decode(), tokens_of(body))
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = str(error.get("code") or error.get("type") or f"http_{answer.status}")
    message = str(error.get("message") or f"The request failed with HTTP status {answer.status}.")
    line = OutputLine(line_id(), custom_id, Response(answer.status, rid, body), Error(code, message))
    return Outcome(False, _encode(line).decode())


def error_line(
    custom_id: str, code: str, message: str, status: int | None = None, rid: str | None = None
) -> Outcome:
    """An error line for a request that got no HTTP answer (or one made up here, with ``status``)."""
    response = None
    if status is not None:
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
        response = Response(status, rid or request_id(), body)
    return Outcome(False, _encode(OutputLine(line_id(), custom_id, response, Error(code, message))).decode())


def tokens_of(body: dict[str, Any]) -> Tokens:
    """Token counts of a chat completion (``prompt_tokens``...) or a Response (``input_tokens``...)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return Tokens()

    def num(obj: Any, *names: str) -> int:
        for name in names:
            if isinstance(obj, dict) and isinstance(obj.get(name), int):
                return int(obj[name])
        return 0

    details_in = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    details_out = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
    return Tokens(
        input=num(usage, "prompt_tokens", "input_tokens"),
        output=num(usage, "completion_tokens", "output_tokens"),
        cached=num(details_in, "cached_tokens"),
        reasoning=num(details_out, "reasoning_tokens"),
    )
