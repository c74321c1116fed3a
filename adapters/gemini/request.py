"""Gemini, the request: an OpenAI chat call → ``generateContent`` / ``streamGenerateContent?alt=sse``.

Messages → ``contents`` with roles ``user``/``model`` (consecutive same-role turns merged, empty ones
dropped); system and developer text → ``systemInstruction``; tool results → ``functionResponse``
parts named after the call they answer (found by id earlier in the history); sampling options →
``generationConfig``; tools → ``functionDeclarations`` (plain JSON Schema in
``parametersJsonSchema``); ``tool_choice`` → ``toolConfig``; a tool call's
``extra_content.google.thought_signature`` goes back as its ``thoughtSignature``. Wire facts:
docs/providers.md, Gemini.
"""

from __future__ import annotations

import base64
import mimetypes
import re
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import msgspec

from adapters.base import USER_AGENT, Call, UpstreamRequest
from core.errors import InvalidRequest
from core.kept import as_sent, once
from core.wire import AudioPart, ContentPart, FilePart, ImagePart, RefusalPart, TextPart, Tool, ToolCall

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

EFFORT_BUDGET = {"none": 0, "minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
# the ids we make up (response.new_call_id); never sent back to Gemini
_SYNTH = re.compile(r"call_[0-9a-f]{24}")
_SAMPLING = (
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
    ("top_k", "topK"),
)


def _invalid(message: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param="messages", code=code)


def _inline(url: str) -> dict[str, Any]:
    """A ``data:`` URL → an ``inlineData`` part (base64 without the prefix)."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise _invalid("An image or file data URL has no ',' before its data.", "invalid_image_url")
    meta = head[5:]
    mime = meta.split(";", 1)[0] or "application/octet-stream"
    if ";base64" not in meta:
        payload = base64.b64encode(unquote_to_bytes(payload)).decode()
    return {"inlineData": {"mimeType": mime, "data": payload}}


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        return _inline(url)
    if url.startswith(("http://", "https://", "gs://")):
        mime = mimetypes.guess_type(urlsplit(url).path)[0] or "image/jpeg"
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise _invalid("An image URL must be an http(s) URL or a data: URL.", "invalid_image_url")


def _part(part: ContentPart) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"text": part.text} if part.text else None
    if isinstance(part, ImagePart):
        return _image(part.image_url if isinstance(part.image_url, str) else part.image_url.url)
    if isinstance(part, RefusalPart):
        return {"text": part.refusal} if part.refusal else None
    if isinstance(part, AudioPart):
        audio = part.input_audio
        return {
            "inlineData": {
                "mimeType": f"audio/{audio.get('format') or 'wav'}",
                "data": audio.get("data") or "",
            }
        }
    if isinstance(part, FilePart):
        data = part.file.get("file_data")
        if isinstance(data, str) and data.startswith("data:"):
            return _inline(data)
    raise _invalid("This provider takes files only inline, as 'file_data' data URLs.", "unsupported_content")


def _parts(content: str | list[ContentPart] | None) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [p for p in map(_part, content or ()) if p is not None]


def _text(content: str | list[ContentPart] | None) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(p.text for p in content if isinstance(p, TextPart))


def _arguments(tool_call: ToolCall) -> dict[str, Any]:
    text = tool_call.function.arguments
    try:
        args = _decode(text) if text.strip() else {}
    except msgspec.DecodeError:
        args = None
    if not isinstance(args, dict):
        raise _invalid(
            f"The arguments of tool call '{tool_call.id}' must be a JSON object.", "invalid_tool_arguments"
        )
    return args


def _signature(raw_call: Any) -> str | None:
    if not isinstance(raw_call, dict):
        return None
    google = (raw_call.get("extra_content") or {}).get("google") or {}
    value = google.get("thought_signature") if isinstance(google, dict) else None
    return value if isinstance(value, str) else None


def _function_call(tool_call: ToolCall, raw_call: Any) -> dict[str, Any]:
    fc: dict[str, Any] = {"name": tool_call.function.name, "args": _arguments(tool_call)}
    if not _SYNTH.fullmatch(tool_call.id):
        fc["id"] = tool_call.id
    part: dict[str, Any] = {"functionCall": fc}
    signature = _signature(raw_call)
    if signature:
        part["thoughtSignature"] = signature
    return part


def _function_response(
    name: str, call_id: str | None, content: str | list[ContentPart] | None
) -> dict[str, Any]:
    text = _text(content)
    try:
        value = _decode(text)
    except msgspec.DecodeError:
        value = None
    fr: dict[str, Any] = {"name": name, "response": value if isinstance(value, dict) else {"result": text}}
    if call_id and not _SYNTH.fullmatch(call_id):
        fr["id"] = call_id
    return {"functionResponse": fr}


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    """Add a turn, merged into the previous one when the role repeats; empty turns are dropped."""
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def build_contents(call: Call) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(contents, systemInstruction parts) from the OpenAI message list."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id → function name, from the assistant turns seen so far
    raw_messages = call.raw.get("messages") or []
    for i, message in enumerate(call.request.messages):
        if message.role in ("system", "developer"):
            text = _text(message.content)
            if text:
                system.append({"text": text})
        elif message.role == "assistant":
            parts = _parts(message.content)
            raw_calls = (
                raw_messages[i].get("tool_calls") if isinstance(raw_messages[i], dict) else None
            ) or []
            for j, tool_call in enumerate(message.tool_calls or ()):
                names[tool_call.id] = tool_call.function.name
                parts.append(_function_call(tool_call, raw_calls[j] if j < len(raw_calls) else None))
            _append(contents, "model", parts)
        elif message.role in ("tool", "function"):
            call_id = message.tool_call_id or None
            name = names.get(call_id) if call_id else None
            name = name or message.name or None
            if not name:
                raise _invalid(
                    f"Message {i} answers tool call '{call_id}', which no earlier assistant message made.",
                    "unknown_tool_call_id",
                )
            _append(contents, "user", [_function_response(name, call_id, message.content)])
        else:
            _append(contents, "user", _parts(message.content))
    if not contents:
        raise _invalid("The conversation has no user or assistant content to send.", "empty_messages")
    return contents, system


def _tools(call: Call) -> list[dict[str, Any]]:
    """The body's ``tools`` (for a kept set, :class:`core.kept.Shared`, made once for the set)."""
    return once(call.request.tools or [], "gemini", _declarations)


def _declarations(tools: list[Tool]) -> list[dict[str, Any]]:
    declarations = []
    for tool in tools:
        if tool.type != "function":
            raise InvalidRequest(
                f"Tools of type '{tool.type}' are not supported by this provider.", param="tools"
            )
        fn = tool.function
        decl: dict[str, Any] = {"name": fn.name}
        if fn.description:
            decl["description"] = fn.description
        if fn.parameters:
            decl["parametersJsonSchema"] = fn.parameters
        declarations.append(decl)
    return [{"functionDeclarations": declarations}] if declarations else []


def _tool_config(choice: str | dict[str, Any] | None) -> dict[str, Any] | None:
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
    if choice is None:
        return None
    if isinstance(choice, str) and choice in modes:
        config: dict[str, Any] = {"mode": modes[choice]}
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and (choice.get("function") or {}).get("name")
    ):
        config = {"mode": "ANY", "allowedFunctionNames": [choice["function"]["name"]]}
    else:
        raise InvalidRequest(
            "'tool_choice' must be 'auto', 'none', 'required' or a named function.", param="tool_choice"
        )
    return {"functionCallingConfig": config}


def _response_format(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") not in ("json_object", "json_schema"):
        return {}
    out: dict[str, Any] = {"responseMimeType": "application/json"}
    schema = (value.get("json_schema") or {}).get("schema") if value["type"] == "json_schema" else None
    if isinstance(schema, dict):
        out["responseJsonSchema"] = schema
    return out


def _thinking(call: Call) -> dict[str, Any] | None:
    effort = call.raw.get("reasoning_effort")
    config: dict[str, Any] = {}
    if isinstance(effort, str) and effort in EFFORT_BUDGET:
        if call.model.upstream.startswith("gemini-3"):
            config["thinkingLevel"] = "MINIMAL" if effort == "none" else effort.upper()
        else:
            config["thinkingBudget"] = EFFORT_BUDGET[effort]
        config["includeThoughts"] = effort != "none"  # shown as reasoning_content
    return config or None


def generation_config(call: Call) -> dict[str, Any]:
    req, raw = call.request, call.raw
    config: dict[str, Any] = {}
    if req.temperature is not None:
        config["temperature"] = req.temperature
    if req.top_p is not None:
        config["topP"] = req.top_p
    cap = req.output_cap
    if cap is not None:
        config["maxOutputTokens"] = min(cap, call.model.max_output) if call.model.max_output else cap
    if req.stop:
        config["stopSequences"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.n is not None and req.n > 1:
        config["candidateCount"] = req.n
    for name, field in _SAMPLING:
        value = raw.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            config[field] = value
    config.update(_response_format(raw.get("response_format")))
    thinking = _thinking(call)
    if thinking:
        config["thinkingConfig"] = thinking
    return config


def build(call: Call) -> UpstreamRequest:
    contents, system = build_contents(call)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    tools = _tools(call)
    if tools:
        body["tools"] = as_sent(tools)  # (a kept set's: its JSON, encoded once for the set)
        tool_config = _tool_config(call.request.tool_choice)
        if tool_config:
            body["toolConfig"] = tool_config
    config = generation_config(call)
    if config:
        body["generationConfig"] = config
    method = "streamGenerateContent?alt=sse" if call.stream else "generateContent"
    headers = {
        "x-goog-api-key": call.deployment.api_key,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }
    if call.stream:
        headers["Accept"] = "text/event-stream"
    url = f"{call.deployment.base_url}/models/{call.upstream_model}:{method}"
    return UpstreamRequest(url, headers, _encode(body))
