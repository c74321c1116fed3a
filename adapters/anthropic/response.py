"""Anthropic Messages, the answer: a ``message`` → an OpenAI ``chat.completion`` and its usage.

``tool_use`` blocks become ``tool_calls``, ``thinking`` blocks ``reasoning_content``; in JSON mode the
answer tool's input is the content; usage counts the cached prompt parts in (``input_tokens`` is the
uncached part only). Wire facts: docs/providers.md, Anthropic.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from adapters.anthropic.request import JSON_TOOL, json_mode
from adapters.base import REASONING, THINKING_BLOCKS, Call
from core.errors import UpstreamError
from core.wire import TokenUsage

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_from_anthropic(usage: Any) -> TokenUsage | None:
    """``input_tokens`` is the uncached part only: the prompt is its sum with both cache counts."""
    if not isinstance(usage, dict):
        return None
    read = _int(usage.get("cache_read_input_tokens"))
    write = _int(usage.get("cache_creation_input_tokens"))
    ttl = usage.get("cache_creation")
    hour = min(_int(ttl.get("ephemeral_1h_input_tokens")), write) if isinstance(ttl, dict) else 0
    output = _int(usage.get("output_tokens"))
    details = usage.get("output_tokens_details")
    thinking = _int(details.get("thinking_tokens")) if isinstance(details, dict) else 0
    return TokenUsage(
        prompt=_int(usage.get("input_tokens")) + read + write,
        completion=output,
        cached=read,
        cache_write=write,
        cache_write_1h=hour,
        reasoning=min(thinking, output),
    )


def with_thinking_share(usage: TokenUsage | None, thinking_chars: int, other_chars: int) -> TokenUsage | None:
    """Anthropic counts thinking inside ``output_tokens`` and does not say how much of it was thinking:
    an answer that thought gets that count split by the characters of its thinking and of the rest
    (text, tool arguments), flagged ``reasoning_estimated`` (never a claimed 0, never above the output)."""
    if usage is None or not thinking_chars or usage.reasoning:
        return usage
    share = usage.completion * thinking_chars // (thinking_chars + other_chars)
    return msgspec.structs.replace(usage, reasoning=share, reasoning_estimated=True)


def openai_usage(usage: TokenUsage) -> dict[str, Any]:
    out = usage.openai()
    if usage.cache_write:
        out["prompt_tokens_details"]["cache_write_tokens"] = usage.cache_write
    return out


def finish_reason(stop_reason: Any) -> str:
    return STOP_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def _read_blocks(
    content: list[Any],
) -> tuple[list[str], list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    signed: list[dict[str, Any]] = []  # the thinking blocks whole (thinking_blocks)
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text") or ""))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
            signed.append(
                {
                    "type": "thinking",
                    "thinking": str(block.get("thinking") or ""),
                    "signature": str(block.get("signature") or ""),
                }
            )
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            signed.append({"type": "redacted_thinking", "data": block["data"]})
        elif kind == "tool_use":
            arguments = _encode(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    return text, thinking, calls, signed


def error_text(data: dict[str, Any]) -> str:
    err = obj(data.get("error"))
    kind, message = err.get("type"), err.get("message")
    return f"{kind}: {message}" if kind and message else str(message or kind or "unknown error")


def parse(provider: str, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        raise UpstreamError(f"The provider '{provider}' returned a body that is not JSON.") from None
    if obj(data).get("type") == "error":
        raise UpstreamError(f"The provider '{provider}' failed: {error_text(data)}")
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise UpstreamError(f"The provider '{provider}' returned an unexpected answer shape.")
    text, thinking, calls, signed = _read_blocks(data["content"])
    reason = finish_reason(data.get("stop_reason"))
    answer = (
        next((c for c in calls if c["function"]["name"] == JSON_TOOL), None) if json_mode(call.raw) else None
    )
    if answer is not None:  # JSON mode: the tool's input is the answer
        text, calls = [answer["function"]["arguments"]], [c for c in calls if c is not answer]
        reason = reason if calls else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message[REASONING] = "".join(thinking)
    if signed:
        message[THINKING_BLOCKS] = signed
    other = sum(map(len, text)) + sum(len(c["function"]["arguments"]) for c in calls)
    usage = with_thinking_share(usage_from_anthropic(data.get("usage")), sum(map(len, thinking)), other)
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
    out: dict[str, Any] = {"created": int(time.time()), "choices": [choice]}
    if usage is not None:
        out["usage"] = openai_usage(usage)
    return out, usage
