"""Gemini, the answer: a ``GenerateContentResponse`` → an OpenAI ``chat.completion`` and its usage,
and Gemini's error bodies → gateway errors.

Candidates → choices; ``thought`` parts → ``reasoning_content``, never ``content``; ``functionCall``
parts → ``tool_calls`` (id made up when Gemini gives none, arguments a JSON string, finish reason
``tool_calls``), their ``thoughtSignature`` riding along as ``extra_content.google.thought_signature``
(the convention of Google's own OpenAI-compatible endpoint) so that clients hand it back next turn;
``inlineData`` parts of image models → ``images``; ``usageMetadata`` → usage (thoughts count as
completion and reasoning tokens). Wire facts: docs/providers.md, Gemini.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

from adapters.base import REASONING, Call, map_upstream_error
from core.errors import GatewayError, UpstreamError
from core.wire import TokenUsage

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "LANGUAGE"})


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def finish_reason(reason: str, has_calls: bool) -> str:
    """Gemini ``finishReason`` → OpenAI ``finish_reason``: calls are known from the parts."""
    if reason == "MAX_TOKENS":
        return "length"
    if reason in FILTERED or reason.startswith("IMAGE_"):
        return "content_filter"
    return "tool_calls" if has_calls else "stop"


def usage_from_gemini(meta: Any) -> TokenUsage | None:
    """``usageMetadata`` → TokenUsage: ``candidatesTokenCount`` excludes thoughts, so add them."""
    if not isinstance(meta, dict):
        return None
    thoughts = int(meta.get("thoughtsTokenCount") or 0)
    prompt = int(meta.get("promptTokenCount") or 0) + int(meta.get("toolUsePromptTokenCount") or 0)
    return TokenUsage(
        prompt=prompt,
        completion=int(meta.get("candidatesTokenCount") or 0) + thoughts,
        cached=min(int(meta.get("cachedContentTokenCount") or 0), prompt),
        reasoning=thoughts,
    )


def _tool_call(fc: dict[str, Any], signature: Any) -> dict[str, Any]:
    args = fc.get("args")
    out: dict[str, Any] = {
        "id": fc.get("id") or new_call_id(),
        "type": "function",
        "function": {
            "name": fc.get("name") or "",
            "arguments": _encode(args if isinstance(args, dict) else {}).decode(),
        },
    }
    if isinstance(signature, str) and signature:
        out["extra_content"] = {"google": {"thought_signature": signature}}
    return out


class Parts(NamedTuple):
    """What one candidate's ``content`` holds, in OpenAI's terms."""

    text: str
    thoughts: str
    calls: list[dict[str, Any]]
    images: list[dict[str, Any]]  # generated images (image models), as OpenRouter's message.images


def read_parts(content: Any) -> Parts:
    parts = content.get("parts") if isinstance(content, dict) else None
    text: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        fc, inline = part.get("functionCall"), part.get("inlineData")
        if isinstance(fc, dict):
            calls.append(_tool_call(fc, part.get("thoughtSignature")))
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else text).append(part["text"])
        elif isinstance(inline, dict) and isinstance(inline.get("data"), str) and not part.get("thought"):
            url = f"data:{inline.get('mimeType') or 'image/png'};base64,{inline['data']}"
            images.append({"type": "image_url", "image_url": {"url": url}})
    return Parts("".join(text), "".join(thoughts), calls, images)


def blocked(data: dict[str, Any]) -> bool:
    feedback = data.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def error_of(data: Any) -> Any:
    """The ``error`` object of a decoded body, also of a JSON-array stream's ``[{"error": ...}]``."""
    if isinstance(data, list) and data:
        data = data[0]
    return data.get("error") if isinstance(data, dict) else None


def error_text(err: Any) -> str:
    return str((err.get("message") if isinstance(err, dict) else err) or "unknown error")


def _retry_after(err: Any) -> str | None:
    """``google.rpc.RetryInfo.retryDelay`` (a Duration such as ``"37s"``) → whole seconds."""
    details = err.get("details") if isinstance(err, dict) else None
    for detail in details if isinstance(details, list) else ():
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return str(max(1, math.ceil(float(delay[:-1]))))
            except ValueError:
                return None
    return None


def parse(provider: str, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        raise UpstreamError(f"The provider '{provider}' returned a body that is not JSON.") from None
    err = error_of(data)
    if err is not None:
        raise UpstreamError(f"The provider '{provider}' failed: {error_text(err)}")
    if not isinstance(data, dict):
        raise UpstreamError(f"The provider '{provider}' returned an unexpected answer shape.")
    candidates = [c for c in data.get("candidates") or () if isinstance(c, dict)]
    if not candidates and not blocked(data):
        raise UpstreamError(f"The provider '{provider}' returned no candidates.")
    choices = [_choice(c, i) for i, c in enumerate(candidates)]
    if not choices:  # the prompt itself was blocked: empty content, content_filter
        choices = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ""},
                "finish_reason": "content_filter",
            }
        ]
    choices.sort(key=lambda c: c["index"])
    usage = usage_from_gemini(data.get("usageMetadata"))
    out: dict[str, Any] = {
        "id": data.get("responseId") or "",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model_id,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = usage.openai()
    return out, usage


def with_parts(out: dict[str, Any], parts: Parts) -> dict[str, Any]:
    """``out`` (a message or a delta) with a candidate's reasoning, tool calls and images, if any."""
    if parts.thoughts:
        out[REASONING] = parts.thoughts
    if parts.calls:
        out["tool_calls"] = parts.calls
    if parts.images:
        out["images"] = parts.images
    return out


def _choice(candidate: dict[str, Any], position: int) -> dict[str, Any]:
    parts = read_parts(candidate.get("content"))
    content = None if parts.calls and not parts.text else parts.text
    message = with_parts({"role": "assistant", "content": content}, parts)
    reason = finish_reason(str(candidate.get("finishReason") or "STOP"), bool(parts.calls))
    return {
        "index": candidate.get("index", position),
        "message": message,
        "logprobs": None,
        "finish_reason": reason,
    }


def upstream_error(provider: str, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
    if status == 400 and b"API_KEY_INVALID" in body:
        status = 401  # Gemini says 400 for a bad key: it is the gateway's credential
    if status == 429 and "retry-after" not in headers:  # Gemini has no header, only RetryInfo
        try:
            retry = _retry_after(error_of(_decode(body)))
        except msgspec.DecodeError:
            retry = None
        if retry:
            headers = {"retry-after": retry}
    return map_upstream_error(provider, status, body, headers)
