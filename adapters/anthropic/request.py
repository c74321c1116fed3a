"""Anthropic Messages, the request: an OpenAI chat call → the body of ``POST {base_url}/messages``.

System and developer messages are lifted to the top-level ``system``; ``tool`` messages become
``tool_result`` blocks of a user turn; consecutive same-role turns are merged (tool results first);
``max_tokens`` is always sent; temperature is clamped to 0..1; ``reasoning_effort`` becomes extended
thinking; ``response_format`` becomes a tool the model must call (JSON mode). Wire facts:
docs/providers.md, Anthropic.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec

from adapters.base import THINKING_BLOCKS, USER_AGENT, Call, UpstreamRequest
from core.errors import InvalidRequest
from core.kept import as_sent, once
from core.wire import ChatRequest, FilePart, ImagePart, Message, RefusalPart, TextPart, Tool, ToolCall

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
FIRST_TURN = "."  # Anthropic wants a user turn first; sent when a conversation starts with the assistant
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
EFFORT_BUDGET = {"low": 1024, "medium": 4096, "high": 16384}  # reasoning_effort → thinking budget
MIN_BUDGET = 1024
_BAD_ID = re.compile(r"[^a-zA-Z0-9_-]")
_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))

Block = dict[str, Any]


def _invalid(message: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param="messages", code=code)


# ------------------------------------------------------------------ request: content blocks


def tool_id(value: str) -> str:
    """Anthropic tool ids must match ``^[a-zA-Z0-9_-]+$``; foreign ids are rewritten deterministically."""
    return _BAD_ID.sub("_", value) or "toolu_"


def _sniff(data: str) -> str | None:
    try:
        head = base64.b64decode(data[:24] + "=" * (-len(data[:24]) % 4))
    except ValueError:
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _MAGIC if head.startswith(magic)), None)


def _data_url(url: str) -> tuple[str, str]:
    """``data:<mime>;base64,<data>`` → (mime, data)."""
    header, sep, data = url[5:].partition(",")
    mime, _, encoding = header.partition(";")
    if not sep or encoding.lower() != "base64":
        raise _invalid("Data URLs must have the form data:<mime>;base64,<data>.", "invalid_image_url")
    return mime.strip().lower(), data


def _image(part: ImagePart) -> Block:
    url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    if not url.startswith("data:"):
        raise _invalid("An image_url must be an http(s) URL or a base64 data: URL.", "invalid_image_url")
    mime, data = _data_url(url)
    mime = "image/jpeg" if mime == "image/jpg" else mime
    if mime not in IMAGE_TYPES:
        mime = _sniff(data) or mime
    if mime not in IMAGE_TYPES:
        raise _invalid(
            f"Image type {mime or 'unknown'!r} is not supported by Anthropic: use JPEG, PNG, GIF or WebP.",
            "unsupported_image_type",
        )
    return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}


def _document(part: FilePart) -> Block:
    data = part.file.get("file_data")
    if not isinstance(data, str) or not data.startswith("data:"):
        raise _invalid(
            "Files must be sent inline as file_data (a base64 data: URL); file ids are not supported here."
        )
    mime, payload = _data_url(data)
    if mime != "application/pdf":
        raise _invalid(f"File type {mime!r} is not supported by Anthropic: only PDF documents are.")
    return {"type": "document", "source": {"type": "base64", "media_type": mime, "data": payload}}


def _part(part: Any) -> Block | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, RefusalPart):
        return {"type": "text", "text": part.refusal} if part.refusal else None
    if isinstance(part, ImagePart):
        return _image(part)
    if isinstance(part, FilePart):
        return _document(part)
    raise _invalid("Audio input is not supported by Anthropic models.", "unsupported_content")


def _blocks(content: str | list[Any] | None, raw: dict[str, Any]) -> list[Block]:
    """Content blocks of one message; ``cache_control`` on a part (or on the message) is kept."""
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}] if content else []
    else:
        blocks = []
        raw_parts: list[Any] = raw["content"] if isinstance(raw.get("content"), list) else []
        for i, part in enumerate(content or ()):
            block = _part(part)
            if block is None:
                continue
            raw_part = raw_parts[i] if i < len(raw_parts) else None
            if isinstance(raw_part, dict) and isinstance(raw_part.get("cache_control"), dict):
                block["cache_control"] = raw_part["cache_control"]
            blocks.append(block)
    if blocks and isinstance(raw.get("cache_control"), dict):
        blocks[-1]["cache_control"] = raw["cache_control"]
    return blocks


def _tool_input(call: ToolCall) -> dict[str, Any]:
    text = call.function.arguments
    if not text.strip():
        return {}
    try:
        value = _decode(text)
    except msgspec.DecodeError:
        raise _invalid(
            f"The arguments of tool call '{call.id}' are not valid JSON.", "invalid_tool_arguments"
        ) from None
    if not isinstance(value, dict):
        raise _invalid(
            f"The arguments of tool call '{call.id}' must be a JSON object.", "invalid_tool_arguments"
        )
    return value


def _thinking_blocks(given: Any) -> list[Block]:
    """An assistant message's ``thinking_blocks`` (as this adapter returned them) → Anthropic blocks;
    anything else in the list is left out."""
    out: list[Block] = []
    for block in given if isinstance(given, list) else ():
        if not isinstance(block, dict):
            continue
        if (
            block.get("type") == "thinking"
            and isinstance(block.get("thinking"), str)
            and isinstance(block.get("signature"), str)
        ):
            out.append({"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]})
        elif block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
            out.append({"type": "redacted_thinking", "data": block["data"]})
    return out


def _tool_result(message: Message, raw: dict[str, Any]) -> Block:
    if not isinstance(message.tool_call_id, str):
        raise _invalid(
            "A 'tool' message needs the 'tool_call_id' of the call it answers.", "missing_tool_call_id"
        )
    block: Block = {"type": "tool_result", "tool_use_id": tool_id(message.tool_call_id)}
    if isinstance(message.content, str):
        if message.content:
            block["content"] = message.content
    else:
        inner = _blocks(message.content, {"content": raw.get("content")})
        if inner:
            block["content"] = inner
    if isinstance(raw.get("cache_control"), dict):
        block["cache_control"] = raw["cache_control"]
    return block


def _turn(message: Message, raw: dict[str, Any]) -> tuple[str, list[Block]]:
    if message.role == "tool":
        return "user", [_tool_result(message, raw)]
    if message.role == "function":
        raise _invalid(
            "The legacy 'function' role is not supported for Anthropic models; use 'tool' messages."
        )
    blocks = _blocks(message.content, raw)
    if message.role == "assistant":  # its thinking blocks, signed, first (a tool loop's next turn needs them)
        blocks[:0] = _thinking_blocks(raw.get(THINKING_BLOCKS))
    if message.role == "assistant" and isinstance(message.tool_calls, list):
        for call in message.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": tool_id(call.id),
                    "name": call.function.name,
                    "input": _tool_input(call),
                }
            )
    return message.role, blocks


def _system(blocks: list[Block]) -> str | list[Block]:
    if len(blocks) == 1 and "cache_control" not in blocks[0]:
        return str(blocks[0]["text"])
    return blocks


def _strip_prefill(turns: list[dict[str, Any]]) -> None:
    """A final assistant turn is a prefill, which may not end with whitespace."""
    blocks = turns[-1]["content"]
    if turns[-1]["role"] != "assistant" or not blocks or blocks[-1].get("type") != "text":
        return
    blocks[-1]["text"] = blocks[-1]["text"].rstrip()
    if not blocks[-1]["text"]:
        blocks.pop()
    if not blocks:
        turns.pop()


def conversation(request: ChatRequest, raw: dict[str, Any]) -> tuple[list[Block], list[dict[str, Any]]]:
    """(system blocks, alternating user/assistant turns starting with user)."""
    system: list[Block] = []
    turns: list[dict[str, Any]] = []
    raw_messages: list[Any] = raw["messages"] if isinstance(raw.get("messages"), list) else []
    for i, message in enumerate(request.messages):
        raw_message = raw_messages[i] if i < len(raw_messages) and isinstance(raw_messages[i], dict) else {}
        if message.role in ("system", "developer"):
            system.extend(b for b in _blocks(message.content, raw_message) if b["type"] == "text")
            continue
        role, blocks = _turn(message, raw_message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:  # tool results must open their user turn
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    if not turns and system:  # only system messages: they are the request
        turns, system = [{"role": "user", "content": system}], []
    if not turns:
        raise _invalid("The messages have no content to send.", "empty_messages")
    if turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": FIRST_TURN}]})
    _strip_prefill(turns)
    return system, turns


# ------------------------------------------------------------------ request: parameters


def _tools(request: ChatRequest) -> list[Block]:
    """The tool blocks (for a kept set, :class:`core.kept.Shared`, made once for the set)."""
    return once(request.tools or [], "anthropic", _tool_blocks)


def _tool_blocks(tools: list[Tool]) -> list[Block]:
    out: list[Block] = []
    for tool in tools:
        if tool.type != "function":
            raise InvalidRequest(
                f"Tools of type {tool.type!r} are not supported for Anthropic models.", param="tools"
            )
        fn = tool.function
        schema = (
            dict(fn.parameters) if isinstance(fn.parameters, dict) else {"type": "object", "properties": {}}
        )
        schema.setdefault("type", "object")
        item: Block = {"name": fn.name, "input_schema": schema}
        if isinstance(fn.description, str) and fn.description:
            item["description"] = fn.description
        if fn.strict is True:
            item["strict"] = True
        out.append(item)
    return out


def tool_choice(choice: str | dict[str, Any] | None, parallel: Any) -> Block | None:
    """OpenAI ``tool_choice`` (+ ``parallel_tool_calls``) → Anthropic ``tool_choice``."""
    out: Block | None
    if choice is None:
        out = {"type": "auto"} if parallel is False else None
    elif choice in ("auto", "none"):
        out = {"type": choice}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        out = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise InvalidRequest(
            "tool_choice must be 'auto', 'none', 'required' or a named function.", param="tool_choice"
        )
    if out is not None and parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def max_tokens(call: Call) -> int:
    cap = call.request.output_cap or call.model.default_max_tokens or DEFAULT_MAX_TOKENS
    return min(cap, call.model.max_output) if call.model.max_output > 0 else cap


def _thinking(call: Call, body: dict[str, Any]) -> None:
    """``thinking`` (passed through) or ``reasoning_effort`` → extended thinking within ``max_tokens``."""
    thinking = call.raw.get("thinking")
    if thinking is None:
        effort = call.raw.get("reasoning_effort")
        budget = EFFORT_BUDGET.get(effort) if isinstance(effort, str) else None
        turns = body["messages"]
        if budget is None or (turns[-1]["content"][0]["type"] == "tool_result" and not _thought(turns)):
            return  # mid tool loop, the assistant turn without its signed thinking block: no thinking
        if budget >= body["max_tokens"] and call.request.output_cap is None:  # no cap asked: make room
            limit = call.model.max_output if call.model.max_output > 0 else budget + body["max_tokens"]
            body["max_tokens"] = min(budget + body["max_tokens"], limit)
        if budget >= body["max_tokens"]:  # still too big: leave about half of the cap for the answer
            budget = min(max(MIN_BUDGET, body["max_tokens"] // 2), body["max_tokens"] - 1)
        if budget < MIN_BUDGET:
            return  # the caller's cap leaves no room to think
        thinking = {"type": "enabled", "budget_tokens": budget}
    body["thinking"] = thinking
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        body.pop("temperature", None)  # thinking allows only the default temperature, no top_k
        body.pop("top_k", None)
        if body.get("top_p", 1) < 0.95:
            body.pop("top_p")


def _thought(turns: list[dict[str, Any]]) -> bool:
    """The assistant turn before the last (a tool loop's) opens with its thinking block."""
    return (
        len(turns) > 1
        and bool(turns[-2]["content"])
        and turns[-2]["content"][0]["type"] in ("thinking", "redacted_thinking")
    )


def _sampling(call: Call, body: dict[str, Any]) -> None:
    request, raw = call.request, call.raw
    if request.n is not None and request.n > 1:
        raise InvalidRequest("Anthropic models return one choice per request: 'n' must be 1.", param="n")
    if request.temperature is not None:
        body["temperature"] = min(request.temperature, 1.0)
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if isinstance(raw.get("top_k"), int):
        body["top_k"] = raw["top_k"]
    if request.stop:
        body["stop_sequences"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
    if isinstance(raw.get("user"), str) and raw["user"]:
        body["metadata"] = {"user_id": raw["user"]}


# JSON mode (response_format): Anthropic's classic API has none, so the answer is asked for as the
# input of a tool the model must call (docs/providers.md, Anthropic), and that input comes back as content.
JSON_TOOL = "json_response"


def json_mode(raw: dict[str, Any]) -> bool:
    """Whether the call asks for JSON (``response_format`` ``json_object`` / ``json_schema``)."""
    fmt = raw.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


def json_tool(raw: dict[str, Any]) -> Block | None:
    """The tool that stands for ``response_format``, if the call asks for JSON."""
    if not json_mode(raw):
        return None
    fmt = raw["response_format"]
    schema: dict[str, Any] = {"type": "object"}
    about = "Give your whole answer as this tool's input, a JSON object."
    spec = fmt.get("json_schema") if fmt["type"] == "json_schema" else None
    if isinstance(spec, dict):
        if isinstance(spec.get("schema"), dict):
            schema = {"type": "object", **spec["schema"]}
        if isinstance(spec.get("description"), str):
            about += " " + spec["description"]
    if schema.get("type") != "object":
        raise InvalidRequest(
            "For Anthropic models a JSON schema in response_format must describe an object "
            "(its top-level type must be 'object').",
            param="response_format",
        )
    return {"name": JSON_TOOL, "description": about, "input_schema": schema}


def request_body(call: Call) -> dict[str, Any]:
    system, turns = conversation(call.request, call.raw)
    body: dict[str, Any] = {"model": call.upstream_model, "max_tokens": max_tokens(call), "messages": turns}
    if system:
        body["system"] = _system(system)
    _sampling(call, body)
    tools = _tools(call.request)
    if tools:
        body["tools"] = as_sent(tools)  # (a kept set's blocks: their JSON, encoded once for the set)
        choice = tool_choice(call.request.tool_choice, call.raw.get("parallel_tool_calls"))
        if choice is not None:
            body["tool_choice"] = choice
    if call.stream:
        body["stream"] = True
    _thinking(call, body)
    answer = json_tool(call.raw)
    if answer is not None:
        body["tools"] = [*tools, answer]
        if not tools:  # with tools of its own the caller's tool_choice stands; thinking allows no
            # forced tool, so then the tool's description asks
            body["tool_choice"] = (
                {"type": "auto"} if "thinking" in body else {"type": "tool", "name": JSON_TOOL}
            )
    return body


def build(call: Call) -> UpstreamRequest:
    headers = {
        "x-api-key": call.deployment.api_key,
        "anthropic-version": VERSION,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    if call.stream:
        headers["accept"] = "text/event-stream"
    body = request_body(call)  # max_tokens: reasoning_effort may have raised it to make room to think
    return UpstreamRequest(f"{call.deployment.base_url}/messages", headers, _encode(body), body["max_tokens"])
