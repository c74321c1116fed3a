"""The Anthropic Messages API ⇄ chat, for ``POST /v1/messages`` on a model of any other protocol
(docs/api.md, "Messages"). Pure: dicts in, dicts out.

    to_chat(body)                 a Messages request → the chat request the chat legs take
    from_completion(chat, model)  a chat completion → an Anthropic ``message``
    stop_reason(finish_reason)    chat's finish reason → Anthropic's stop reason
    reserve_request(body)         the chat-shaped view the checks, rate limits and worst case read

What only tunes a feature the other provider lacks (``cache_control``, ``context_management``,
``service_tier``, ``top_k``, ``container``, ``inference_geo``) is left out; hosted tools (Anthropic's
server tools: a ``type`` other than ``custom``) are left out and named by :func:`omitted_tools`, unless
``tool_choice`` forces one; what changes the call's meaning and cannot be honoured (``mcp_servers``)
is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.errors import InvalidRequest
from core.kept import once
from core.types import new_id
from core.wire import ChatRequest, FunctionDef, ImagePart, ImageURL, Message, Tool

_encode = msgspec.json.Encoder().encode

# Anthropic's request fields (MessageCreateParams and the beta's), and what becomes of each here
TAKEN = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "output_config",
        "output_format",
    }
)
LEFT_OUT = frozenset(
    {
        "top_k",
        "cache_control",
        "context_management",
        "service_tier",
        "container",
        "inference_geo",
        "diagnostics",
        "speed",
        "betas",
    }
)
REFUSED = {"mcp_servers": "MCP servers are run by Anthropic's API only: use an anthropic/... model"}
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high", "xhigh": "high", "minimal": "low"}
_SOME_TOOL = Tool(function=FunctionDef(name="tools"))  # the view says only whether the call has tools


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


# ------------------------------------------------------------------ the request


_KNOWN = TAKEN | LEFT_OUT


def check_fields(body: dict[str, Any]) -> None:
    if body.keys() <= _KNOWN:  # (every field known: one set comparison)
        return
    for name in body:
        if name in REFUSED:
            raise _invalid(
                f"'{name}' is not supported for this model: {REFUSED[name]}.", name, "unsupported_parameter"
            )
        if name not in TAKEN and name not in LEFT_OUT:
            raise _invalid(f"{name}: Extra inputs are not permitted", name, "unknown_parameter")


def _text_of(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, block in enumerate(value):
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise _invalid(f"{param}.{i}: Input should be a text block", f"{param}.{i}")
            parts.append(block["text"])
        return "\n\n".join(parts)
    raise _invalid(f"{param}: Input should be a valid string or a list of text blocks", param)


def _system_text(content: list[Any], where: str) -> str:
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "mid_conv_system" and isinstance(block.get("content"), list):
            parts.append(_system_text(block["content"], f"{where}.{j}.content"))
        elif kind not in ("tool_addition", "tool_removal"):
            raise _invalid(f"{where}.{j}: a system message holds text blocks", f"{where}.{j}")
    return "\n\n".join(p for p in parts if p)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _invalid(f"{where}.source: Field required", where)
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if (
        source.get("type") == "base64"
        and isinstance(source.get("data"), str)
        and isinstance(source.get("media_type"), str)
    ):
        return {
            "type": "image_url",
            "image_url": {"url": f"data:{source['media_type']};base64,{source['data']}"},
        }
    raise _invalid(f"{where}.source: an image source is 'base64' (media_type, data) or 'url' (url)", where)


def _document(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "application/pdf"
        return {
            "type": "file",
            "file": {
                "file_data": f"data:{media};base64,{source['data']}",
                "filename": str(block.get("title") or "document.pdf"),
            },
        }
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": source["data"]}
    raise _invalid(
        f"{where}.source: only base64 and text documents can be sent to this model",
        where,
        "unsupported_content",
    )


def _tool_result(block: dict[str, Any], where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ``tool_result`` block → a chat ``tool`` message, and the images it held (they follow it in a
    user message: chat tool messages carry text only)."""
    content = block.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image":
                images.append(_image(part, f"{where}.content.{j}"))
            elif kind == "document":
                texts.append(str(_document(part, f"{where}.content.{j}").get("text", "")))
            elif kind == "search_result":
                texts.extend(str(b.get("text", "")) for b in part.get("content") or () if isinstance(b, dict))
            # (tool_reference and the like: what Anthropic's own tools return, nothing to say elsewhere)
    elif content is not None:
        raise _invalid(f"{where}.content: Input should be a valid string or list", where)
    text = "\n".join(texts)
    if block.get("is_error") is True:
        text = f"Error: {text}" if text else "Error"
    if not isinstance(block.get("tool_use_id"), str):
        raise _invalid(f"{where}.tool_use_id: Field required", where)
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text or "(empty)"}, images


def _user(content: list[Any], where: str) -> list[dict[str, Any]]:
    """One user turn → chat messages: its tool results first (as ``tool`` messages), then the rest."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):  # (most blocks: no place named)
            parts.append({"type": "text", "text": block["text"]})
            continue
        at = f"{where}.content.{j}"
        if kind == "text":
            raise _invalid(f"{at}.text: Field required", at)
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "document":
            parts.append(_document(block, at))
        elif kind == "tool_result":
            message, images = _tool_result(block, at)
            out.append(message)
            parts.extend(images)
        elif kind in ("search_result", "thinking", "redacted_thinking"):
            continue
        else:
            raise _invalid(f"{at}.type: '{kind}' blocks are not allowed in user messages", at)
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
            continue
        at = f"{where}.content.{j}"
        if kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _invalid(f"{at}: a tool_use block has an id and a name", at)
            arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": _encode(arguments).decode()},
                }
            )
        elif kind in ("thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"):
            continue  # the provider's own state (a signature is Anthropic's alone), or a hosted tool's turn
        else:
            raise _invalid(f"{at}.type: '{kind}' blocks are not allowed in assistant messages", at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise _invalid("messages: at least one message is required", "messages")
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _text_of(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, message in enumerate(given):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if role is not None else None
        # (the common turn, as _user would make it)
        if role == "user" and content and isinstance(content, str):
            out.append({"role": "user", "content": content})
            continue
        where = f"messages.{i}"
        if role not in ("user", "assistant", "system"):
            raise _invalid(f"{where}.role: Input should be 'user', 'assistant' or 'system'", where)
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise _invalid(f"{where}.content: Input should be a valid string or list", where)
        if message["role"] == "system":  # a mid-conversation system message
            text = _system_text(content, f"{where}.content")
            if text:
                out.append({"role": "system", "content": text})
        elif message["role"] == "user":
            out.extend(_user(content, where))
        else:
            assistant = _assistant(content, where)
            if assistant["content"] is not None or assistant.get("tool_calls"):
                out.append(assistant)
    return out


def hosted(tool: Any) -> bool:
    """A tool Anthropic runs or defines (``web_search_...``, ``bash_...``, ...), not the caller's function."""
    return isinstance(tool, dict) and tool.get("type") not in (None, "custom")


def omitted_tools(body: dict[str, Any]) -> list[str]:
    """The hosted tools left out of a translated call (named in the answer's header)."""
    tools = body.get("tools")
    return (
        [str(t.get("name") or t.get("type")) for t in tools if hosted(t)] if isinstance(tools, list) else []
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _invalid("tools: Input should be a valid list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _invalid(f"tools.{i}: Input should be a valid dictionary", f"tools.{i}")
        if hosted(tool):
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _invalid(f"tools.{i}.name: Field required", f"tools.{i}.name")
        if not isinstance(schema, dict):
            raise _invalid(f"tools.{i}.input_schema: Field required", f"tools.{i}.input_schema")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _hosted_not_forced(tools: list[Any], choice: Any) -> None:
    """A ``tool_choice`` may not force a hosted tool: only Anthropic runs those."""
    forced = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "tool" else None
    if forced is not None:
        for tool in tools:
            if hosted(tool) and tool.get("name") == forced:
                raise _invalid(
                    f"tool_choice: the tool '{forced}' is one Anthropic runs ({tool.get('type')}); this "
                    "model's provider cannot run it",
                    "tool_choice",
                    "unsupported_tool",
                )


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """Anthropic ``tool_choice`` → chat ``tool_choice`` and ``parallel_tool_calls``."""
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _invalid(
            "tool_choice: Input tag does not match any of the expected tags: 'auto', 'any', 'tool', 'none'",
            "tool_choice",
        )
    kind = choice["type"]
    parallel = False if choice.get("disable_parallel_tool_use") is True else None
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _invalid("tool_choice.tool.name: Field required", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def effort(body: dict[str, Any]) -> str | None:
    """Anthropic's thinking and ``output_config.effort`` → a chat ``reasoning_effort`` (None: not asked)."""
    config = body.get("output_config")
    named = config.get("effort") if isinstance(config, dict) else None
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is not None and kind not in ("enabled", "disabled", "adaptive"):
        raise _invalid(
            "thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'",
            "thinking",
        )
    if kind == "disabled":
        return None
    if isinstance(named, str):
        if named not in EFFORTS:
            raise _invalid(f"output_config.effort: unknown effort {named!r}", "output_config.effort")
        return EFFORTS[named]
    if kind == "enabled":
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
            raise _invalid(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
                "thinking.budget_tokens",
            )
        return "low" if budget <= 2048 else "medium" if budget <= 8192 else "high"
    return "medium" if kind == "adaptive" else None


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else body.get("output_format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise _invalid(
            "output_config.format: Input should be {'type': 'json_schema', 'schema': {...}}",
            "output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request → the chat request the chat pipeline takes (``model`` as the caller wrote it)."""
    check_fields(body)
    chat: dict[str, Any] = {
        "model": body["model"],
        "messages": messages(body),
        "max_tokens": body["max_tokens"],
    }
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _invalid("stop_sequences: Input should be a valid list of strings", "stop_sequences")
        chat["stop"] = stops
    if body.get("tools"):
        # (Claude Code's every turn: translated once, core/kept.py)
        tools = once(body["tools"], "chat", _tools)
        _hosted_not_forced(body["tools"], body.get("tool_choice"))
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        choice, parallel = _tool_choice(body["tool_choice"])
        if "tools" in chat:
            chat["tool_choice"] = choice
            if parallel is not None:
                chat["parallel_tool_calls"] = parallel
    if "output_config" in body or "output_format" in body or "thinking" in body:
        fmt = _response_format(body)
        if fmt is not None:
            chat["response_format"] = fmt
        reasoning = effort(body)
        if reasoning is not None:
            chat["reasoning_effort"] = reasoning
    if "metadata" in body:
        user = end_user(body)
        if user:
            chat["user"] = user
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def end_user(body: dict[str, Any]) -> str | None:
    """``metadata.user_id``: who the call is for."""
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) and user else None


def reserve_request(body: dict[str, Any]) -> ChatRequest:
    """The chat-shaped view of a Messages call that the checks, rate limits and worst case read: the
    model, its images, its output cap, whether it has tools."""
    parts: list[Any] = []
    for message in body["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") in ("image", "tool_result"):
                inner = block.get("content") if block["type"] == "tool_result" else [block]
                # (a wrong type: refused after the checks)
                for image in inner if isinstance(inner, list) else ():
                    if isinstance(image, dict) and image.get("type") == "image":
                        parts.append(ImagePart(image_url=ImageURL(url="data:")))
    tools = body.get("tools")
    return ChatRequest(
        model=body["model"],
        messages=[Message(role="user", content=parts)] if parts else [],
        max_tokens=body["max_tokens"],
        tools=[_SOME_TOOL] if isinstance(tools, list) and any(not hosted(t) for t in tools) else None,
    )


def estimate_prompt(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request, chat-shaped enough to estimate its tokens (billing/tokens.py counts text
    blocks, images and tools): the system as a first message."""
    given = body["messages"]
    system = body.get("system")
    prompt: dict[str, Any] = {
        "messages": [{"role": "system", "content": system}, *given] if system else given
    }
    if body.get("tools"):
        prompt["tools"] = body["tools"]
    return prompt


# ------------------------------------------------------------------ the answer


def stop_reason(finish_reason: Any) -> str:
    return STOP_REASONS.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else "end_turn"


def message_id() -> str:
    return "msg_" + new_id()


def anthropic_usage(usage: Any) -> dict[str, Any]:
    """A chat usage object → Anthropic's: ``input_tokens`` is the uncached part."""
    if not isinstance(usage, dict):
        usage = {}
    prompt, output = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    if not details or not isinstance(details, dict):  # (most answers: nothing cached)
        return {
            "input_tokens": prompt,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output,
        }
    read, write = _count(details.get("cached_tokens")), _count(details.get("cache_write_tokens"))
    return {
        "input_tokens": max(prompt - read - write, 0),
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "output_tokens": output,
    }


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def from_completion(completion: dict[str, Any], model_id: str) -> dict[str, Any]:
    """A chat completion (one choice) → an Anthropic ``message``."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + new_id(),
                "name": function.get("name"),
                "input": tool_input(function.get("arguments")),
            }
        )
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model_id,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": anthropic_usage(completion.get("usage")),
    }


def tool_input(arguments: Any) -> Any:
    """A tool call's arguments (a JSON string) as the object Anthropic's ``input`` is."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = msgspec.json.decode(arguments or "{}")
    except (msgspec.DecodeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}
