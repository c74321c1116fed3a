"""The Gemini API protocol (p3: ``google/…``, also ``gemini/…``): generateContent and
streamGenerateContent?alt=sse on the Generative Language API (reference/providers.md §4).

Request: messages → ``contents`` with roles ``user``/``model`` (consecutive same-role turns merged,
empty ones dropped); system and developer text → ``systemInstruction``; tool results →
``functionResponse`` parts named after the call they answer (found by id earlier in the history);
sampling options → ``generationConfig``; tools → ``functionDeclarations`` (plain JSON Schema in
``parametersJsonSchema``); ``tool_choice`` → ``toolConfig``.

Answer: candidates → choices; ``thought`` parts → ``reasoning_content``, never ``content``;
``functionCall`` parts → ``tool_calls`` (id synthesised when Gemini gives none, arguments a JSON
string, finish reason ``tool_calls``); ``usageMetadata`` → usage (thoughts count as completion and
reasoning tokens). A stream is data-only SSE without ``[DONE]``: the chunk carrying ``finishReason``
ends it. Thought signatures ride on tool calls as ``extra_content.google.thought_signature`` (the
convention of Google's own OpenAI-compatible endpoint) so that clients hand them back next turn.
"""

from __future__ import annotations

import base64
import math
import mimetypes
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes, urlsplit

import msgspec

from adapters import register
from adapters.base import (
    USER_AGENT,
    Adapter,
    Call,
    StreamTranslator,
    UpstreamRequest,
    UpstreamStreamError,
    map_upstream_error,
)
from core.errors import GatewayError, InvalidRequest, UpstreamError
from core.sse import Event
from core.wire import (
    AudioPart,
    ContentPart,
    FilePart,
    ImagePart,
    RefusalPart,
    TextPart,
    TokenUsage,
    ToolCall,
)

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

REASONING = "reasoning_content"
FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "LANGUAGE"})
EFFORT_BUDGET = {"none": 0, "minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
_SYNTH = re.compile(r"call_[0-9a-f]{24}")  # the ids we make up; never sent back to Gemini
_SAMPLING = (
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
    ("top_k", "topK"),
)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def finish_reason(reason: str, has_calls: bool) -> str:
    """Gemini ``finishReason`` → OpenAI ``finish_reason`` (§4.4): calls are known from the parts."""
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


# ------------------------------------------------------------------ request: OpenAI → Gemini


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
    declarations = []
    for tool in call.request.tools or ():
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


# ------------------------------------------------------------------ answer: Gemini → OpenAI


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


def _blocked(data: dict[str, Any]) -> bool:
    feedback = data.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def _error(data: Any) -> Any:
    """The ``error`` object of a decoded body, also of a JSON-array stream's ``[{"error": ...}]``."""
    if isinstance(data, list) and data:
        data = data[0]
    return data.get("error") if isinstance(data, dict) else None


def _message(err: Any) -> str:
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


class GeminiAdapter(Adapter):
    protocol = "gemini"

    def build_request(self, call: Call) -> UpstreamRequest:
        contents, system = build_contents(call)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = {"parts": system}
        tools = _tools(call)
        if tools:
            body["tools"] = tools
            tool_config = _tool_config(call.request.tool_choice)
            if tool_config:
                body["toolConfig"] = tool_config
        config = generation_config(call)
        if config:
            body["generationConfig"] = config
        method = "streamGenerateContent?alt=sse" if call.stream else "generateContent"
        headers = {"x-goog-api-key": call.provider.api_key, "Content-Type": "application/json", "User-Agent": USER_AGENT}
        if call.stream:
            headers["Accept"] = "text/event-stream"
        url = f"{call.provider.base_url}/models/{call.model.upstream}:{method}"
        return UpstreamRequest(url, headers, _encode(body))

    def parse_response(self, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
        try:
            data = _decode(body)
        except msgspec.DecodeError:
            raise UpstreamError(f"The provider '{self.name}' returned a body that is not JSON.") from None
        err = _error(data)
        if err is not None:
            raise UpstreamError(f"The provider '{self.name}' failed: {_message(err)}")
        if not isinstance(data, dict):
            raise UpstreamError(f"The provider '{self.name}' returned an unexpected answer shape.")
        candidates = [c for c in data.get("candidates") or () if isinstance(c, dict)]
        if not candidates and not _blocked(data):
            raise UpstreamError(f"The provider '{self.name}' returned no candidates.")
        choices = [self._choice(c, i) for i, c in enumerate(candidates)]
        if not choices:  # the prompt itself was blocked (§8.7 16): empty content, content_filter
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

    @staticmethod
    def _choice(candidate: dict[str, Any], position: int) -> dict[str, Any]:
        text, thoughts, calls, images = read_parts(candidate.get("content"))
        message: dict[str, Any] = {"role": "assistant", "content": None if calls and not text else text}
        if thoughts:
            message[REASONING] = thoughts
        if calls:
            message["tool_calls"] = calls
        if images:
            message["images"] = images
        reason = finish_reason(str(candidate.get("finishReason") or "STOP"), bool(calls))
        return {
            "index": candidate.get("index", position),
            "message": message,
            "logprobs": None,
            "finish_reason": reason,
        }

    def stream(self, call: Call) -> StreamTranslator:
        return GeminiStream(self.name, call.request.n or 1)

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
        if status == 400 and b"API_KEY_INVALID" in body:
            status = 401  # Gemini says 400 for a bad key (§8.7 19): it is the gateway's credential
        if status == 429 and "retry-after" not in headers:  # Gemini has no header, only RetryInfo
            try:
                retry = _retry_after(_error(_decode(body)))
            except msgspec.DecodeError:
                retry = None
            if retry:
                headers = {"retry-after": retry}
        return map_upstream_error(self.name, status, body, headers)


class GeminiStream(StreamTranslator):
    """``data: <GenerateContentResponse>`` events → OpenAI chunks. Each event holds only new parts;
    usage is a running total on every event, so the last one wins."""

    def __init__(self, provider: str, candidates: int = 1) -> None:
        super().__init__()
        self.provider = provider
        self.expected = candidates
        self.calls: dict[int, int] = {}  # candidate index → tool calls emitted so far
        self.done: set[int] = set()

    def feed(self, event: Event) -> list[dict[str, Any]]:
        try:
            data = _decode(event.data)
        except msgspec.DecodeError:
            if event.data.strip() == b"[DONE]":
                return []  # not Gemini's, but harmless (a proxy in between)
            raise UpstreamStreamError(
                f"The provider '{self.provider}' sent a malformed stream event."
            ) from None
        err = _error(data)
        if err is not None:
            raise UpstreamStreamError(f"The provider '{self.provider}' failed mid-stream: {_message(err)}")
        if not isinstance(data, dict):
            raise UpstreamStreamError(f"The provider '{self.provider}' sent an unexpected stream event.")
        usage = usage_from_gemini(data.get("usageMetadata"))
        if usage is not None:
            self.usage = usage
        candidates = [c for c in data.get("candidates") or () if isinstance(c, dict)]
        if not candidates:
            if not _blocked(data):
                return []
            self.finished = True
            return [{"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}]
        choices = [c for c in (self._choice(c, i) for i, c in enumerate(candidates)) if c is not None]
        if len(self.done) >= self.expected:
            self.finished = True
        return [{"choices": choices}] if choices else []

    def _choice(self, candidate: dict[str, Any], position: int) -> dict[str, Any] | None:
        index = candidate.get("index", position)
        if index in self.done:
            return None
        text, thoughts, calls, images = read_parts(candidate.get("content"))
        delta: dict[str, Any] = {}
        if thoughts:
            delta[REASONING] = thoughts
        if text:
            delta["content"] = text
        if images:
            delta["images"] = images
        if calls:
            first = self.calls.get(index, 0)
            for offset, tool_call in enumerate(calls):
                tool_call["index"] = first + offset
            self.calls[index] = first + len(calls)
            delta["tool_calls"] = calls
        reason = candidate.get("finishReason")
        finish = None
        if reason:
            finish = finish_reason(str(reason), self.calls.get(index, 0) > 0)
            self.done.add(index)
        if not delta and finish is None:
            return None
        return {"index": index, "delta": delta, "finish_reason": finish}


register("gemini", GeminiAdapter)
