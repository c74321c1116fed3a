"""Emulator of the Anthropic Messages API: ``POST /v1/messages`` (JSON and ``event:`` streams) and
``GET /v1/models``, validated and answered in the real wire format (docs/providers.md, Anthropic).

Like the real API it wants ``x-api-key`` and ``anthropic-version``, requires ``max_tokens``, rejects
fields it does not know, roles other than user/assistant, empty content, unpaired ``tool_use`` /
``tool_result`` blocks, a prefill ending in whitespace and out-of-range sampling; it combines
consecutive same-role turns, and emulates the prompt cache (a ``cache_control`` breakpoint over at
least 1024 tokens is written once, then read). The common directives (``emulators.directives``)
drive faults, lengths, tool use and thinking; ``count_tokens`` honours ``[fault:N]`` and ``[flaky:N]``
(the real one fails as ``messages`` does: 500, 529 overloaded).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from emulators.common import Emulator, decode, encode, nth, pause, play, random_id, retry_after
from emulators.directives import Directives, Flakiness, count_tokens, directives, reply_pieces

# id -> (display name, max output tokens, created_at)
# the account's organization, named in its rate-limit errors
ORGANIZATION = "5f0c9a3e-7d1b-4c2a-9e8f-3b6d2a1c0e94"

MODELS = {
    "claude-opus-4-8": ("Claude Opus 4.8", 128000, "2026-05-05T00:00:00Z"),
    "claude-sonnet-4-6": ("Claude Sonnet 4.6", 128000, "2026-02-13T00:00:00Z"),
    "claude-opus-4-5-20251101": ("Claude Opus 4.5", 64000, "2025-11-24T00:00:00Z"),
    "claude-opus-4-1-20250805": ("Claude Opus 4.1", 32000, "2025-08-05T00:00:00Z"),
    "claude-sonnet-4-5-20250929": ("Claude Sonnet 4.5", 64000, "2025-09-29T00:00:00Z"),
    "claude-haiku-4-5-20251001": ("Claude Haiku 4.5", 64000, "2025-10-01T00:00:00Z"),
    "claude-3-7-sonnet-20250219": ("Claude Sonnet 3.7", 64000, "2025-02-24T00:00:00Z"),
    "claude-3-5-haiku-20241022": ("Claude Haiku 3.5", 8192, "2024-10-22T00:00:00Z"),
}
ALIASES = {
    "claude-opus-4-5": "claude-opus-4-5-20251101",
    "claude-opus-4-1": "claude-opus-4-1-20250805",
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001",
    "claude-3-7-sonnet-latest": "claude-3-7-sonnet-20250219",
    "claude-3-5-haiku-latest": "claude-3-5-haiku-20241022",
}
FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "service_tier",
    "cache_control",
    "output_config",
    "container",
    "inference_geo",
    "mcp_servers",
    "context_management",
    "diagnostics",
    "speed",
}
COUNT_FIELDS = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "context_management",
    "output_config",
    "output_format",
    "cache_control",
}
VERSIONS = {"2023-01-01", "2023-06-01", "2026-10-21"}  # the last is what anthropic SDK 2.x sends
BLOCKS = (
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
)  # (a tuple: any value may be looked up)
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
MIN_CACHE_TOKENS = 1024
THINKING = ["Let", " me", " think", "."]


class Rejected(Exception):
    """A request the real API would refuse: becomes its error envelope."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _require(ok: bool, message: str, status: int = 400) -> None:
    if not ok:
        raise Rejected(message, status)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content or () if isinstance(b, dict)]


def _text(content: Any) -> str:
    """The plain text of a content value (text blocks, and what tool blocks carry)."""
    out: list[str] = []
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            out.append(str(block.get("text", "")))
        elif kind == "tool_result":
            out.append(_text(block.get("content")))
        elif kind == "tool_use":
            out.append(encode(block.get("input", {})).decode())
    return " ".join(out)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------ validation (the real API's messages)


def _check_top(body: dict[str, Any]) -> str:
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise Rejected(f"{extra[0]}: Extra inputs are not permitted")
    _require(isinstance(body.get("model"), str), "model: Field required")
    model = ALIASES.get(body["model"], body["model"])
    _require(model in MODELS, f"model: {body['model']}", 404)
    _require("max_tokens" in body, "max_tokens: Field required")
    _require(
        _is_int(body["max_tokens"]) and body["max_tokens"] >= 0,
        "max_tokens: Input should be a valid integer greater than or equal to 0",
    )
    limit = MODELS[model][1]
    _require(
        body["max_tokens"] <= limit,
        f"max_tokens: {body['max_tokens']} > {limit}, which is the maximum allowed number of output tokens for {model}",
    )
    temperature = body.get("temperature")
    if temperature is not None:
        _require(
            isinstance(temperature, int | float) and 0 <= temperature <= 1,
            "temperature: Input should be less than or equal to 1",
        )
    stops = body.get("stop_sequences")
    if stops is not None:
        _require(
            isinstance(stops, list) and all(isinstance(s, str) for s in stops),
            "stop_sequences: Input should be a valid list of strings",
        )
    _check_system(body)
    return model


def _check_system(body: dict[str, Any]) -> None:
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _require(
            isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system),
            "system: Input should be a valid string or a list of text blocks",
        )


def _check_block(block: Any, role: str, where: str) -> None:
    _require(
        isinstance(block, dict) and block.get("type") in BLOCKS, f"{where}.type: unknown content block type"
    )
    kind = block["type"]
    if kind == "text":
        _require(
            isinstance(block.get("text"), str) and block["text"] != "",
            "messages: text content blocks must be non-empty",
        )
    elif kind == "image":
        source = block.get("source") if isinstance(block.get("source"), dict) else {}
        if source.get("type") == "url":
            _require(isinstance(source.get("url"), str), f"{where}.image.source.url.url: Field required")
        else:
            _require(
                source.get("type") == "base64",
                f"{where}.image.source: Input tag does not match 'base64' or 'url'",
            )
            _require(
                source.get("media_type") in IMAGE_TYPES,
                f"{where}.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'",
            )
            _require(
                isinstance(source.get("data"), str) and source["data"] != "",
                f"{where}.image.source.base64.data: Field required",
            )
    elif kind == "tool_use":
        _require(role == "assistant", f"{where}: tool_use blocks are only allowed in assistant messages")
        _require(
            isinstance(block.get("id"), str) and bool(TOOL_ID.match(block["id"])),
            f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'",
        )
        _require(
            isinstance(block.get("input"), dict),
            f"{where}.tool_use.input: Input should be a valid dictionary",
        )
    elif kind == "tool_result":
        _require(role == "user", f"{where}: tool_result blocks are only allowed in user messages")
        _require(
            isinstance(block.get("tool_use_id"), str), f"{where}.tool_result.tool_use_id: Field required"
        )
        # (ToolResultBlockParam.content: Union[str, Iterable[Content]], anthropic-sdk-python)
        _require(
            isinstance(block.get("content"), str | list | None),
            f"{where}.tool_result.content: Input should be a valid string or a list of content blocks",
        )


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate, then combine consecutive same-role turns as the server does."""
    _require(isinstance(messages, list), "messages: Field required")
    _require(len(messages) > 0, "messages: at least one message is required")
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        _require(
            isinstance(message, dict) and message.get("role") in ("user", "assistant", "system"),
            f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'",
        )
        content = message.get("content")
        if message["role"] == "system":  # a mid-conversation system message: text blocks, not a turn
            _require(
                isinstance(content, str)
                or (
                    isinstance(content, list)
                    and all(
                        isinstance(b, dict) and b.get("type") in ("text", "mid_conv_system") for b in content
                    )
                ),
                f"messages.{i}.content: a system message holds text blocks",
            )
            continue
        _require(isinstance(content, str | list), f"messages.{i}.content: Input should be a valid list")
        final_assistant = i == len(messages) - 1 and message["role"] == "assistant"
        _require(
            bool(content) or final_assistant,
            f"messages.{i}: all messages must have non-empty content except for the optional final assistant message",
        )
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _check_block(block, message["role"], f"messages.{i}.content.{j}")
        if turns and turns[-1]["role"] == message["role"]:
            turns[-1]["content"].extend(_blocks(content))
        else:
            turns.append({"role": message["role"], "content": _blocks(content)})
    _require(bool(turns) and turns[0]["role"] == "user", 'messages: first message must use the "user" role')
    _check_pairs(turns)
    last = turns[-1]
    if last["role"] == "assistant" and last["content"] and last["content"][-1].get("type") == "text":
        text = last["content"][-1]["text"]
        _require(
            text == text.rstrip(), "messages: final assistant content cannot end with trailing whitespace"
        )
    return turns


def _kinds(turn: dict[str, Any]) -> list[str]:
    return [b.get("type") for b in turn["content"]]


def _ids(turn: dict[str, Any], kind: str, key: str) -> list[str]:
    return [b.get(key) for b in turn["content"] if b.get("type") == kind]


def _check_pairs(turns: list[dict[str, Any]]) -> None:
    for k, turn in enumerate(turns):
        if turn["role"] == "assistant" and k + 1 < len(turns):
            answered = set(_ids(turns[k + 1], "tool_result", "tool_use_id"))
            missing = [i for i in _ids(turn, "tool_use", "id") if i not in answered]
            _require(
                not missing,
                f"messages.{k}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            )
        if turn["role"] == "user":
            asked = set(_ids(turns[k - 1], "tool_use", "id")) if k else set()
            kinds = _kinds(turn)
            for j, tid in enumerate(_ids(turn, "tool_result", "tool_use_id")):
                _require(
                    tid in asked,
                    f"messages.{k}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {tid}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                )
            if "tool_result" in kinds:
                first_other = next(j for j, kind in enumerate([*kinds, "end"]) if kind != "tool_result")
                _require(
                    "tool_result" not in kinds[first_other:],
                    f"messages.{k}: `tool_result` blocks must come before any other content",
                )


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        _require(isinstance(tools, list), "tools: Input should be a valid list")
        for i, tool in enumerate(tools):
            _require(isinstance(tool, dict), f"tools.{i}: Input should be a valid dictionary")
            if tool.get("type", "custom") != "custom":
                continue  # a versioned server tool
            _require(
                isinstance(tool.get("name"), str) and bool(TOOL_NAME.match(tool["name"])),
                f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'",
            )
            schema = tool.get("input_schema")
            _require(isinstance(schema, dict), f"tools.{i}.custom.input_schema: Field required")
            _require(
                schema.get("type") == "object",
                f"tools.{i}.custom.input_schema.type: Input should be 'object'",
            )
    choice = body.get("tool_choice")
    if choice is not None:
        _require(
            isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"),
            "tool_choice: Input tag does not match any of the expected tags: 'auto', 'any', 'tool', 'none'",
        )
        if choice["type"] == "tool":
            _require(isinstance(choice.get("name"), str), "tool_choice.tool.name: Field required")


def _thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _check_thinking(body: dict[str, Any]) -> None:
    thinking = body.get("thinking")
    if thinking is None:
        return
    _require(
        isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled", "adaptive"),
        "thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'",
    )
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        _require(
            _is_int(budget) and budget >= 1024,
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        )
        _require(body["max_tokens"] > budget, "`max_tokens` must be greater than `thinking.budget_tokens`")
    if _thinking_on(body):
        _require(
            body.get("temperature") in (None, 1),
            "`temperature` may only be set to 1 when thinking is enabled",
        )
        _require(body.get("top_k") is None, "`top_k` may not be set when thinking is enabled")


def _check_thinking_turns(body: dict[str, Any], turns: list[dict[str, Any]]) -> None:
    """With thinking on, an assistant turn continued by tool results must open with its thinking block."""
    if not _thinking_on(body) or len(turns) < 2 or "tool_result" not in _kinds(turns[-1]):
        return
    first = _kinds(turns[-2])[0] if turns[-2]["content"] else "nothing"
    _require(
        first in ("thinking", "redacted_thinking"),
        f"messages.{len(turns) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block. "
        "We recommend you include thinking blocks from previous turns. To avoid this requirement, disable `thinking`.",
    )


def check_request(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(resolved model id, combined turns), or :class:`Rejected`."""
    model = _check_top(body)
    turns = _check_messages(body.get("messages"))
    _check_tools(body)
    _check_thinking(body)
    _check_thinking_turns(body, turns)
    return model, turns


# ------------------------------------------------------------------ the reply


@dataclass
class Segment:
    kind: str  # thinking | text | tool_use
    pieces: list[str]  # the stream deltas (text, thinking or partial JSON)
    tool: dict[str, Any] | None = None

    def block(self, signature: str) -> dict[str, Any]:
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "".join(self.pieces), "signature": signature}
        if self.kind == "tool_use":
            return {"type": "tool_use", **(self.tool or {})}
        return {"type": "text", "text": "".join(self.pieces)}


@dataclass
class Reply:
    d: Directives
    segments: list[Segment] = field(default_factory=list)
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    output_tokens: int = 0


def _stop_at(pieces: list[str], stops: list[str] | None) -> tuple[list[str], str | None]:
    """Cut the answer before the earliest stop sequence; returns the pieces and the sequence matched."""
    text = "".join(pieces)
    hits = [(text.find(s), s) for s in stops or () if s and s in text]
    if not hits:
        return pieces, None
    at, matched = min(hits)
    out: list[str] = []
    used = 0
    for piece in pieces:
        if used + len(piece) > at:
            if at > used:
                out.append(piece[: at - used])
            break
        out.append(piece)
        used += len(piece)
    return out, matched


def _pick_tool(body: dict[str, Any], d: Directives, answered: bool) -> tuple[dict[str, Any], bool] | None:
    """The tool the model calls (and whether it was forced), if it calls one."""
    tools = [t for t in body.get("tools") or () if t.get("type", "custom") == "custom"]
    choice = body.get("tool_choice") or {"type": "auto"}
    forced = choice["type"] in ("any", "tool")
    if not tools or answered or choice["type"] == "none" or not (d.tool or forced):
        return None
    tool = next(
        (t for t in tools if t["name"] == choice.get("name")), tools[d.tool_index([t["name"] for t in tools])]
    )
    return tool, forced


def _last_user(turns: list[dict[str, Any]]) -> dict[str, Any]:
    return next(t for t in reversed(turns) if t["role"] == "user")


def _text_of(turn: dict[str, Any]) -> str:
    """The text of a turn (the last user turn's holds the directives)."""
    return " ".join(str(b.get("text", "")) for b in turn["content"] if b.get("type") == "text")


def plan(body: dict[str, Any], turns: list[dict[str, Any]]) -> Reply:
    last_user = _last_user(turns)
    results = [b for b in last_user["content"] if b.get("type") == "tool_result"]
    d = directives(_text_of(last_user))
    if results:
        d.echo, d.text = True, "The tool returned: " + "; ".join(_text(b.get("content")) for b in results)
    reply = Reply(d)
    thinking = THINKING if d.think or _thinking_on(body) else []
    if thinking:
        reply.segments.append(Segment("thinking", list(thinking)))
    picked = _pick_tool(body, d, bool(results))
    if picked is not None:
        tool, forced = picked
        if not forced:  # left to choose, Claude says what it is about to do
            reply.segments.append(Segment("text", ["I'll", " use", f" {tool['name']}", "."]))
        arguments = encode(d.arguments(tool["name"], tool.get("input_schema"))).decode()
        half = len(arguments) // 2
        call = {"id": "toolu_01" + random_id(22), "name": tool["name"], "input": decode(arguments)}
        reply.segments.append(Segment("tool_use", ["", arguments[:half], arguments[half:]], call))
        reply.stop_reason = "tool_use"
        reply.output_tokens = len(thinking) + (4 if not forced else 0) + count_tokens(arguments) + 4
        return reply
    prompt = " ".join(_text(t["content"]) for t in turns)
    pieces, truncated = reply_pieces(prompt, d, max(body["max_tokens"] - len(thinking), 0))
    pieces, matched = _stop_at(pieces, body.get("stop_sequences"))
    if pieces:
        reply.segments.append(Segment("text", pieces))
    reply.stop_reason = "stop_sequence" if matched else "max_tokens" if truncated else "end_turn"
    reply.stop_sequence = matched
    reply.output_tokens = len(thinking) + len(pieces)
    return reply


def _units(body: dict[str, Any], turns: list[dict[str, Any]]) -> list[tuple[bytes, int, Any]]:
    """The prompt in cache order (tools, system, messages): (bytes, tokens, cache_control) per part."""
    out = []
    for tool in body.get("tools") or ():
        raw = encode(tool)
        out.append((raw, count_tokens(raw.decode()), tool.get("cache_control")))
    for part in [*_blocks(body.get("system")), *(b for turn in turns for b in turn["content"])]:
        out.append((encode(part), count_tokens(_text([part])), part.get("cache_control")))
    return out


# ------------------------------------------------------------------ the server


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + encode(data) + b"\n\n"


def _input_tokens(units: list[tuple[bytes, int, Any]], turns: list[dict[str, Any]]) -> int:
    """A request's input tokens, from its ``_units``."""
    return sum(tokens for _, tokens, _ in units) + 3 * len(turns) + 3


class AnthropicEmulator(Emulator):
    def __init__(self, api_key: str = "emu-key", rpm: int = 0, itpm: int = 0) -> None:
        super().__init__(api_key, max_body=32 * 1024 * 1024, rpm=rpm)
        self.itpm = itpm  # the organization's input tokens per minute: a request over it alone is refused
        self.cache: set[str] = set()  # prompt-cache prefixes written so far
        self.flakiness = Flakiness()  # count_tokens: [flaky:N]
        self.app.router.add_post("/v1/messages", self.messages)
        self.app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        self.app.router.add_get("/v1/models", self.models)

    # -- errors -----------------------------------------------------------------------------------
    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
        request_id = "req_011C" + random_id(20)
        body = {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": request_id,
        }
        return web.Response(
            status=status,
            body=encode(body),
            content_type="application/json",
            headers={"request-id": request_id, **(headers or {})},
        )

    def fault(self, status: int) -> web.Response:
        if status == 402:
            return self.error(
                402,
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
                "Billing to upgrade or purchase credits.",
            )
        if status == 429:
            return self.input_limited(50_000)
        if status == 529:
            return self.error(529, "Overloaded")
        return self.error(status, "Internal server error")

    def input_limited(self, itpm: int) -> web.Response:
        """Over the organization's input tokens per minute: the same words whether the minute's usage or
        the request alone is over it (as reported in public bug reports; the real message names the
        organization)."""
        return self.error(
            429,
            f"This request would exceed the rate limit for your organization ({ORGANIZATION}) "
            f"of {itpm:,} input tokens per minute. For details, refer to: "
            "https://docs.anthropic.com/en/api/rate-limits. You can see the response headers for "
            "current usage. Please reduce the prompt length or the maximum tokens requested, or try "
            "again later. You may also contact sales at https://www.anthropic.com/contact-sales to "
            "discuss your options for a rate limit increase.",
            {"retry-after": "1", "anthropic-ratelimit-input-tokens-remaining": "0"},
        )

    def _refused(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization", "")
        if not key and bearer.startswith("Bearer "):
            key = bearer[7:]  # what SDKs since 2026 send (the API takes either)
        if not key:
            return self.error(401, "x-api-key header is required")
        if key != self.api_key:
            return self.error(401, "invalid x-api-key")
        version = request.headers.get("anthropic-version")
        if not version:
            return self.error(400, "anthropic-version: header is required")
        if version not in VERSIONS:
            return self.error(400, f"anthropic-version: invalid version {version!r}")
        return None

    async def models(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        data = [
            {"type": "model", "id": mid, "display_name": name, "created_at": created}
            for mid, (name, _, created) in MODELS.items()
        ]
        return web.json_response(
            {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}
        )

    # -- count_tokens -----------------------------------------------------------------------------
    async def count_tokens(self, request: web.Request) -> web.Response:
        """``POST /v1/messages/count_tokens``: the prompt's input tokens (MessageCountTokensParams: no
        ``max_tokens``, no ``stream``), validated as a message would be."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        try:
            extra = sorted(set(body) - COUNT_FIELDS)
            _require(not extra, f"{extra[0] if extra else ''}: Extra inputs are not permitted")
            _require(isinstance(body.get("model"), str), "model: Field required")
            model = ALIASES.get(body["model"], body["model"])
            _require(model in MODELS, f"model: {body['model']}", 404)
            _check_system(body)
            turns = _check_messages(body.get("messages"))
            _check_tools(body)
        except Rejected as exc:
            return self.error(exc.status, exc.message)
        text = _text_of(_last_user(turns))
        d = directives(text)
        if fault := d.fault or self.flakiness.fault("count:" + text, d):
            return self.fault(fault)
        return web.json_response({"input_tokens": _input_tokens(_units(body, turns), turns)})

    # -- messages ---------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object once its key and version are checked, or the API's refusal."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = decode(await request.read())
        except msgspec.DecodeError:
            return self.error(400, "There was an error parsing the body of your request as JSON.")
        if not isinstance(body, dict):
            return self.error(400, "The request body must be a JSON object.")
        return body

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        self.received(body, request.headers)
        if (wait := self.over_limit()) is not None:
            return self.error(
                429,
                "Number of requests has exceeded your per-minute rate limit",
                {"retry-after": retry_after(wait), "anthropic-ratelimit-requests-remaining": "0"},
            )
        try:
            model, turns = check_request(body)
        except Rejected as exc:
            return self.error(exc.status, exc.message)
        if self.itpm and _input_tokens(_units(body, turns), turns) > self.itpm:
            return self.input_limited(self.itpm)
        reply = plan(body, turns)
        await pause(reply.d.slow_ms)
        if reply.d.fault:
            return self.fault(reply.d.fault)
        usage = self._usage(model, body, turns)
        message: dict[str, Any] = {
            "id": "msg_01" + random_id(22),
            "type": "message",
            "role": "assistant",
            "model": model,
        }
        headers = {
            "request-id": "req_011C" + random_id(20),
            "anthropic-ratelimit-requests-limit": "1000",
            "anthropic-ratelimit-requests-remaining": "999",
        }
        if body.get("stream"):
            return await self._stream(request, reply, message, usage, headers)
        if reply.d.malformed:
            return web.Response(
                body=b'{"id": "msg_broken", "type": "message", "content": [', content_type="application/json"
            )
        signature = "Eq" + random_id(40)
        message.update(
            content=[s.block(signature) for s in reply.segments],
            stop_reason=reply.stop_reason,
            stop_sequence=reply.stop_sequence,
            usage={**usage, "output_tokens": reply.output_tokens},
        )
        return web.Response(body=encode(message), content_type="application/json", headers=headers)

    def _usage(self, model: str, body: dict[str, Any], turns: list[dict[str, Any]]) -> dict[str, Any]:
        units = _units(body, turns)
        total = _input_tokens(units, turns)
        marks = [i for i, (_, _, cache) in enumerate(units) if isinstance(cache, dict)]
        read = write = 0
        ttl = "5m"
        if marks:
            prefix = units[: marks[-1] + 1]
            tokens = sum(t for _, t, _ in prefix)
            ttl = units[marks[-1]][2].get("ttl", "5m")
            key = hashlib.sha256(model.encode() + b"".join(raw for raw, _, _ in prefix)).hexdigest()
            if tokens >= MIN_CACHE_TOKENS:
                if key in self.cache:
                    read = tokens
                else:
                    write = tokens
                    self.cache.add(key)
        return {
            "input_tokens": total - read - write,
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": write if ttl != "1h" else 0,
                "ephemeral_1h_input_tokens": write if ttl == "1h" else 0,
            },
            "service_tier": "standard",
        }

    def _events(
        self, reply: Reply, message: dict[str, Any], usage: dict[str, Any]
    ) -> list[tuple[bytes, bool]]:
        """The stream as (framed event, is a content delta)."""
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        events = [(sse("message_start", {"type": "message_start", "message": start}), False)]
        for i, seg in enumerate(reply.segments):
            initial = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if seg.kind == "thinking"
                else {"type": "tool_use", **(seg.tool or {}), "input": {}}
                if seg.kind == "tool_use"
                else {"type": "text", "text": ""}
            )
            events.append(
                (
                    sse(
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": initial},
                    ),
                    False,
                )
            )
            if i == 0:
                events.append((sse("ping", {"type": "ping"}), False))
            kind, key = {
                "thinking": ("thinking_delta", "thinking"),
                "tool_use": ("input_json_delta", "partial_json"),
            }.get(seg.kind, ("text_delta", "text"))
            for piece in seg.pieces:
                delta = {"type": "content_block_delta", "index": i, "delta": {"type": kind, key: piece}}
                events.append((sse("content_block_delta", delta), True))
            if seg.kind == "thinking":
                signature = {"type": "signature_delta", "signature": "Eq" + random_id(40)}
                events.append(
                    (
                        sse(
                            "content_block_delta",
                            {"type": "content_block_delta", "index": i, "delta": signature},
                        ),
                        False,
                    )
                )
            events.append((sse("content_block_stop", {"type": "content_block_stop", "index": i}), False))
        if not reply.segments:
            events.append((sse("ping", {"type": "ping"}), False))
        final = {
            k: usage[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        }
        events.append(
            (
                sse(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                        "usage": {**final, "output_tokens": reply.output_tokens},
                    },
                ),
                False,
            )
        )
        events.append((sse("message_stop", {"type": "message_stop"}), False))
        return events

    async def _stream(
        self,
        request: web.Request,
        reply: Reply,
        message: dict[str, Any],
        usage: dict[str, Any],
        headers: dict[str, str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **headers,
            }
        )
        await response.prepare(request)
        d = reply.d
        events = self._events(reply, message, usage)
        frames, deltas = [data for data, _ in events], [is_delta for _, is_delta in events]
        first = nth(deltas, 1)
        if d.malformed and first is not None:
            frames[first - 1] = (
                b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {\n\n'
            )
        if d.midfail and first is not None:  # right after the first delta, so before any [cut:N]
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            await play(request, response, frames, d, fail=(first, sse("error", error)))
        else:
            await play(
                request, response, frames, d, nth(deltas, max(d.cut, 1)) if d.cut is not None else None
            )
        return response
