"""The Responses API for the provider groups that do not speak it (p2–p5): a request becomes a chat
request, the chat answer becomes a Response object (docs/providers.md, OpenAI Responses).

    to_chat(body)                   Responses request → chat request dict; a feature with no chat
                                    equivalent is a 400 that names it
    shell(body, model_id)           the Response object before any output (status ``in_progress``)
    from_completion(completion, shell)  chat.completion → Response object (by the rules of items the
                                    stream's :class:`EventSynth` follows, so both are built alike)

``previous_response_id``, ``item_reference`` and ``store`` are the gateway's own (gateway/conversation.py
resolves the conversation from the stored responses before it gets here; router/responses_api.py
stores the answer). Reasoning items in the input are dropped (chat providers take no reasoning input),
except what the gateway sealed into one's ``encrypted_content`` (gateway/sealed.py): the provider's
own state of a tool turn, which goes back onto the turn's assistant message and tool calls.

Tools as Codex sends them: a ``namespace`` of functions becomes functions named ``<namespace>__<name>``
(:func:`tool_names` maps them back), a ``custom`` (free-form) tool a function of one string ``input``,
and a hosted tool (``web_search``, ``file_search``, ...) is left out (:func:`omitted_tools`) unless
``tool_choice`` forces it (a 400). Pure functions, no I/O.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from adapters.base import THINKING_BLOCKS
from core.errors import InvalidRequest
from core.kept import Kept, Shared
from gateway.responses_events import Options, item_id, whole

# request fields we translate, or accept as hints with no effect on a chat provider
TRANSLATED = frozenset(
    """model input instructions max_output_tokens temperature top_p tools tool_choice parallel_tool_calls stream
    stream_options text reasoning user metadata store previous_response_id include truncation max_tool_calls
    top_logprobs service_tier safety_identifier prompt_cache_key prompt_cache_retention background
    client_metadata prompt_cache_options context_management""".split()
)
# tools OpenAI runs (or defines, for the client to run in its own item types): left out elsewhere
HOSTED = frozenset(
    """web_search web_search_2025_08_26 web_search_preview web_search_preview_2025_03_11 file_search
    code_interpreter computer computer_use_preview image_generation mcp local_shell shell tool_search apply_patch
    programmatic_tool_calling""".split()
)
_encode = msgspec.json.Encoder().encode
ENCRYPTED = "reasoning.encrypted_content"  # include: reasoning items carry the state to send back
_FLAT = re.compile(r"[^a-zA-Z0-9_-]")
CUSTOM_INPUT = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, free-form text."}},
    "required": ["input"],
    "additionalProperties": False,
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
DETAILS = frozenset({"low", "high", "auto"})
P1_ONLY = "only OpenAI models (openai/...) serve it through /v1/responses"


def _refuse(message: str, param: str | None, code: str = "unsupported_parameter") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _check_fields(body: dict[str, Any]) -> None:
    model = body.get("model")
    for name, value in body.items():
        if name not in TRANSLATED and value is not None:
            raise _refuse(
                f"The parameter '{name}' is not supported for the model `{model}`: {P1_ONLY}.", name
            )
    for name, harmless in (
        ("truncation", "disabled"),
        ("max_tool_calls", None),
        ("top_logprobs", 0),
    ):
        value = body.get(name)
        if value is not None and value != harmless:
            raise _refuse(
                f"The parameter '{name}' ({value!r}) is not supported for the model `{model}`: {P1_ONLY}.",
                name,
            )


# ------------------------------------------------------------------ input → messages


def _kind(obj: dict[str, Any], where: str, default: str | None = None) -> str | None:
    """``obj['type']``: a string, or ``default`` when absent; anything else is the caller's error."""
    kind = obj.get("type", default)
    if kind is not None and not isinstance(kind, str):
        raise InvalidRequest(f"'{where}.type' must be a string.", param=f"{where}.type", code="invalid_type")
    return kind


def _text_of(part: dict[str, Any], where: str) -> str:
    text = part.get("text") if part.get("type") != "refusal" else part.get("refusal")
    if not isinstance(text, str):
        raise InvalidRequest(f"'{where}' needs a string 'text'.", param=where, code="invalid_value")
    return text


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        if part.get("file_id"):
            raise _refuse(
                f"'{where}': images by 'file_id' need the Files API, which this gateway does not offer; "
                "send 'image_url' as an http(s) or data: URL.",
                where,
            )
        raise InvalidRequest(
            f"'{where}': an input_image needs 'image_url' (an http(s) or data: URL).",
            param=where,
            code="invalid_value",
        )
    image: dict[str, Any] = {"url": url}
    detail = part.get("detail")
    if isinstance(detail, str) and detail in DETAILS:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def _content(content: Any, role: str, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"'{where}' must be a string or a list of content parts.", param=where, code="invalid_value"
        )
    parts: list[dict[str, Any]] = []
    texts = True  # every part so far a text part
    for j, part in enumerate(content):
        given = part.get("type") if part.__class__ is dict else None
        if given.__class__ is str and given in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})  # (most parts: no place named)
            continue
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest(f"'{at}' must be a content part object.", param=at, code="invalid_type")
        kind = _kind(part, at)
        if kind in TEXT_PARTS or kind == "refusal":
            parts.append({"type": "text", "text": _text_of(part, at)})
        elif kind == "input_image" and role != "assistant":
            parts.append(_image(part, at))
            texts = False
        else:
            raise _refuse(
                f"Content parts of type {kind!r} ('{at}') are not supported for this model: {P1_ONLY}.", at
            )
    if texts:
        return "".join(p["text"] for p in parts)
    return parts


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    given = item.get("role")
    role = ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise InvalidRequest(
            f"'{where}.role' must be one of user, assistant, system, developer.",
            param=f"{where}.role",
            code="invalid_value",
        )
    return {"role": role, "content": _content(item.get("content"), role, f"{where}.content")}


def _string(item: dict[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str):
        raise InvalidRequest(
            f"'{where}.{field}' must be a string.", param=f"{where}.{field}", code="invalid_value"
        )
    return value


def _function_call(item: dict[str, Any], out: list[dict[str, Any]], where: str) -> None:
    call = {
        "id": _string(item, "call_id", where),
        "type": "function",
        "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)},
    }
    if isinstance(item.get("extra_content"), dict):  # Gemini's thought signature, as on a chat tool call
        call["extra_content"] = item["extra_content"]
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
        if last.get("content") == "":
            last["content"] = None
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    output = item.get("output")
    if isinstance(output, list):
        output = _content(output, "tool", f"{where}.output")
        if not isinstance(output, str):
            raise _refuse(
                f"'{where}.output' may only hold text parts for this model: {P1_ONLY}.", f"{where}.output"
            )
    if not isinstance(output, str):
        raise InvalidRequest(
            f"'{where}.output' must be a string.", param=f"{where}.output", code="invalid_value"
        )
    return {"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": output}


def _item(item: Any, out: list[dict[str, Any]], where: str) -> None:
    if isinstance(item, str):
        out.append({"role": "user", "content": item})
        return
    if not isinstance(item, dict):
        raise InvalidRequest(f"'{where}' must be an input item object.", param=where, code="invalid_value")
    kind = _kind(item, where, "message")
    if kind == "message":
        out.append(_message(item, where))
    elif kind == "function_call":
        _function_call(item, out, where)
    elif kind == "function_call_output" or kind == "custom_tool_call_output":
        out.append(_function_output(item, where))
    elif kind == "custom_tool_call":  # a free-form tool's call: a function of one string, as the tools say
        arguments = msgspec.json.encode({"input": _string(item, "input", where)}).decode()
        _function_call({**item, "arguments": arguments}, out, where)
    elif kind != "reasoning":  # reasoning items (fed back from an earlier output) are dropped
        raise _refuse(
            f"Input items of type {kind!r} ('{where}') are not supported for this model: {P1_ONLY}.", where
        )


class State(NamedTuple):
    """What the gateway sealed into a reasoning item (gateway/sealed.py): the provider's state of one
    tool turn: Anthropic's signed thinking blocks (``b``), Gemini's thought signatures per call (``s``),
    the turn's call ids (``c``)."""

    blocks: list[Any]
    signatures: dict[str, Any]
    calls: list[str]


Opener = Callable[[str, str], dict[str, Any]]  # (sealed text, where) -> payload; raises InvalidRequest


def _states(given: list[Any], opener: Opener | None) -> list[State]:
    states: list[State] = []
    for i, item in enumerate(given):
        sealed = (
            item.get("encrypted_content")
            if isinstance(item, dict) and item.get("type") == "reasoning"
            else None
        )
        if opener is None or not isinstance(sealed, str):
            continue
        payload = opener(sealed, f"input[{i}].encrypted_content")
        if payload:
            states.append(
                State(
                    list(payload.get("b") or ()), dict(payload.get("s") or {}), list(payload.get("c") or ())
                )
            )
    return states


def _restore(out: list[dict[str, Any]], states: list[State]) -> None:
    """Each state back onto the assistant message that holds its calls: the thinking blocks on the
    message, a call's thought signature on the call (as adapters.anthropic and adapters.gemini read them)."""
    for state in states:
        wanted = set(state.calls)
        for message in out:
            calls = message.get("tool_calls") if message["role"] == "assistant" else None
            if not calls or not wanted.intersection(c["id"] for c in calls):
                continue
            if state.blocks and THINKING_BLOCKS not in message:
                message[THINKING_BLOCKS] = state.blocks
            for call in calls:
                signature = state.signatures.get(call["id"])
                if isinstance(signature, dict) and "extra_content" not in call:
                    call["extra_content"] = signature
            break


def messages(body: dict[str, Any], opener: Opener | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest(
                "'instructions' must be a string.", param="instructions", code="invalid_value"
            )
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            _item(item, out, f"input[{i}]")
    else:
        raise InvalidRequest(
            "'input' is required: a string or a list of input items.",
            param="input",
            code="missing_required_parameter",
        )
    if not any(m["role"] != "system" for m in out):
        raise InvalidRequest(
            "'input' must contain at least one message.", param="input", code="invalid_value"
        )
    if isinstance(given, list):
        states = _states(given, opener)
        if states:
            _restore(out, states)
    return out


# ------------------------------------------------------------------ tools, formats, options


class ToolName(NamedTuple):
    """A function the chat provider is given, as the caller named it."""

    name: str
    namespace: str | None = None
    custom: bool = False  # a free-form tool: its one argument ``input`` is the call's input


def flat(namespace: str | None, name: str) -> str:
    """The chat function's name of ``name`` in ``namespace``: ``<namespace>__<name>``, what every provider's
    function names allow (letters, digits, ``_``, ``-``; at most 64)."""
    if namespace is None:
        return name
    joined = _FLAT.sub("_", f"{namespace}__{name}")
    return joined if len(joined) <= 64 else joined[:55] + "_" + format(hash_of(joined), "08x")


def hash_of(text: str) -> int:
    value = 2166136261  # FNV-1a: a stable short suffix (Python's hash() differs per process)
    for byte in text.encode():
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value


def tool_names(body: dict[str, Any]) -> dict[str, ToolName]:
    """The chat function names a call's tools become → the tools as the caller named them (those that
    are not the same name: namespaced functions and free-form tools)."""
    out: dict[str, ToolName] = {}
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "custom":
            out[tool["name"]] = ToolName(tool["name"], custom=True)
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    out[flat(tool["name"], inner["name"])] = ToolName(inner["name"], tool["name"])
    return out


def omitted_tools(body: dict[str, Any], sent: bytes | None = None) -> list[str]:
    """The hosted tools a translated call leaves out (named in the answer's header); ``sent``: the
    tools' bytes, by which a set seen before is read once."""
    kept = _OMITTED.get(sent) if sent is not None else None
    if kept is None:
        tools = body.get("tools")
        kept = (
            [str(t.get("type")) for t in tools if isinstance(t, dict) and t.get("type") in HOSTED]
            if isinstance(tools, list)
            else []
        )
        if sent is not None:
            _OMITTED.put(sent, kept, len(sent))
    return kept


_OMITTED: Kept[list[str]] = Kept(4 << 20)  # the hosted tools of the sets seen, by the size of their JSON


def _function(tool: dict[str, Any], where: str, name: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name or _string(tool, "name", where)}
    for field in ("description", "parameters", "strict"):
        if tool.get(field) is not None:
            function[field] = tool[field]
    return {"type": "function", "function": function}


def _tools(tools: Any, choice: Any = None) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list.", param="tools", code="invalid_value")
    forced = choice.get("type") if isinstance(choice, dict) else None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = _kind(tool, where) if isinstance(tool, dict) else None
        if kind == "function":
            out.append(_function(tool, where))
        elif kind == "namespace":
            namespace = _string(tool, "name", where)
            if not isinstance(tool.get("tools"), list):
                raise InvalidRequest(
                    f"'{where}.tools' must be a list of function tools.",
                    param=f"{where}.tools",
                    code="invalid_type",
                )
            for j, inner in enumerate(tool["tools"]):
                if not isinstance(inner, dict) or inner.get("type", "function") != "function":
                    raise _refuse(
                        f"'{where}.tools[{j}]': a namespace holds function tools.",
                        f"{where}.tools[{j}]",
                        "unsupported_tool",
                    )
                out.append(
                    _function(
                        inner,
                        f"{where}.tools[{j}]",
                        flat(namespace, _string(inner, "name", f"{where}.tools[{j}]")),
                    )
                )
        elif kind == "custom":  # free-form input: one string argument
            function = {"name": _string(tool, "name", where), "parameters": CUSTOM_INPUT}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            out.append({"type": "function", "function": function})
        elif kind in HOSTED:  # run by OpenAI alone: left out (named in x-router-omitted-tools)
            if forced == kind:
                raise _refuse(
                    f"tool_choice forces the tool {kind!r}, which only OpenAI runs: {P1_ONLY}.",
                    "tool_choice",
                    "unsupported_tool",
                )
        else:
            raise _refuse(
                f"The tool type {kind!r} ({where}) is not supported for this model.",
                where,
                "unsupported_tool",
            )
    return out


_KNOWN: Kept[tuple[Shared[dict[str, Any]], dict[str, ToolName]]] = Kept(4 << 20)  # by the size of their JSON


def _known_key(choice: Any, encoded: bytes) -> tuple[bytes, Any]:
    forced = choice.get("type") if isinstance(choice, dict) else None
    return encoded, forced if forced in HOSTED else None  # (a forced hosted tool is a 400)


def known_tools(tools: Any, choice: Any, encoded: bytes) -> list[dict[str, Any]]:
    """The chat tools of a call's ``tools`` (``encoded``: their JSON), each distinct set translated once
    (with its names, :func:`known_names`): an agent sends the same tools every turn (Codex: 30). Kept
    by their bytes (:class:`core.kept.Kept`): shared, read it, never change it. A :class:`core.kept.Shared`
    list, so what the chat pipeline makes of it (structs, an adapter's blocks) is made once per set too."""
    key = _known_key(choice, encoded)
    known = _KNOWN.get(key)
    if known is None:
        known = (Shared(_tools(tools, choice)), tool_names({"tools": tools}))
        _KNOWN.put(key, known, len(encoded))
    return known[0]


def known_names(body: dict[str, Any], encoded: bytes) -> dict[str, ToolName]:
    """:func:`tool_names` of ``body``, kept with its tools' translation when :func:`known_tools` made it."""
    known = _KNOWN.get(_known_key(body.get("tool_choice"), encoded))
    return known[1] if known is not None else tool_names(body)


def _tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and isinstance(choice.get("name"), str)
    ):
        namespace = choice.get("namespace") if isinstance(choice.get("namespace"), str) else None
        return {"type": "function", "function": {"name": flat(namespace, choice["name"])}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise _refuse(
        f"tool_choice {kind!r} is not supported for this model: use 'none', 'auto', 'required' or "
        "{'type': 'function', 'name': ...}.",
        "tool_choice",
    )


def _text_format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object.", param="text", code="invalid_value")
    fmt = text.get("format") or {"type": "text"}  # (``verbosity``: a hint the chat providers lack)
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(
        f"text.format type {kind!r} is not one of text, json_object, json_schema.",
        param="text.format",
        code="invalid_value",
    )


def _reasoning(reasoning: Any) -> str | None:
    """``reasoning.effort``; a summary (``summary``, ``generate_summary``) is the provider's thinking
    text as summary parts (gateway/responses_events.py)."""
    if not isinstance(reasoning, dict):
        raise InvalidRequest("'reasoning' must be an object.", param="reasoning", code="invalid_value")
    effort = reasoning.get("effort")
    return effort if isinstance(effort, str) else None


def cache_marked(chat: dict[str, Any]) -> dict[str, Any]:
    """``chat`` with its last system message marked for the prompt cache (``prompt_cache_key`` on a model
    whose provider caches up to a marked block: Anthropic; the tools before it are cached with it)."""
    messages = chat["messages"]
    last = max((i for i, m in enumerate(messages) if m["role"] == "system"), default=None)
    if last is None:
        return chat
    marked = {**messages[last], "cache_control": {"type": "ephemeral"}}
    return {**chat, "messages": [*messages[:last], marked, *messages[last + 1 :]]}


def options(
    body: dict[str, Any], seal: Callable[[dict[str, Any]], str] | None, tools: bytes | None = None
) -> Options:
    """How a translated answer is written back: its thinking as summary parts when a summary is asked,
    the caller's tool names, and the provider's state sealed into a reasoning item when the caller asks
    for ``reasoning.encrypted_content`` (it keeps nothing: ``store: false``, as Codex)."""
    reasoning = body.get("reasoning")
    summary = (
        isinstance(reasoning, dict)
        and (reasoning.get("summary") or reasoning.get("generate_summary")) is not None
    )
    include = body.get("include")
    sealed = seal if isinstance(include, list) and ENCRYPTED in include else None
    names = known_names(body, tools) if tools else tool_names(body)
    return Options(summary=summary, names=names, seal=sealed)


def to_chat(body: dict[str, Any], opener: Opener | None = None, tools: bytes | None = None) -> dict[str, Any]:
    """A Responses request → the chat request the chat pipeline takes (``model`` as the caller wrote it);
    ``opener`` opens what the gateway sealed into reasoning items (else they are dropped); ``tools``:
    the request's tools encoded (:func:`encoded_tools`), to translate a set seen before only once."""
    _check_fields(body)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages(body, opener)}
    for ours, theirs in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("user", "user"),
    ):
        if body.get(ours) is not None:
            chat[theirs] = body[ours]
    if body.get("tools"):
        given = body["tools"]
        translated = (
            known_tools(given, body.get("tool_choice"), tools)
            if tools
            else _tools(given, body.get("tool_choice"))
        )
        if translated:
            chat["tools"] = translated
    if body.get("tool_choice") is not None and "tools" in chat:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None and (fmt := _text_format(body["text"])) is not None:
        chat["response_format"] = fmt
    if body.get("reasoning") is not None and (effort := _reasoning(body["reasoning"])) is not None:
        chat["reasoning_effort"] = effort
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# ------------------------------------------------------------------ both groups: images, estimates


def image_urls(body: dict[str, Any]) -> list[str]:
    """The image URLs of a Responses input (lenient: for capability checks and reservations)."""
    urls: list[str] = []
    given = body.get("input")
    for item in given if isinstance(given, list) else ():
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "input_image":
                urls.append(str(part.get("image_url") or part.get("file_id") or ""))
    return urls


def estimate_prompt(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat-shaped parts billing.tokens.count_request counts, only to
    estimate its prompt when no usage came (lenient)."""
    text = body.get("text")
    return {
        "messages": _estimate_messages(body),
        "tools": body.get("tools"),
        "response_format": text.get("format") if isinstance(text, dict) else None,
    }


def _estimate_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    for item in [given] if isinstance(given, str) else given if isinstance(given, list) else ():
        if isinstance(item, str):
            out.append({"role": "user", "content": item})
        elif isinstance(item, dict):
            content = item.get("content") if item.get("content") is not None else item.get("output")
            if item.get("type") == "function_call":
                content = f"{item.get('name', '')}{item.get('arguments', '')}"
            parts = (
                content if isinstance(content, list) else [{"type": "input_text", "text": str(content or "")}]
            )
            out.append({"role": "user", "content": [_estimate_part(p) for p in parts if isinstance(p, dict)]})
    return out


def _estimate_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "input_image":
        return {"type": "image_url"}
    return {"type": "text", "text": str(part.get("text") or part.get("refusal") or "")}


# ------------------------------------------------------------------ the Response object


def encoded_tools(body: dict[str, Any], sent: bytes | None = None) -> bytes | None:
    """A request's tools as JSON, if it has a list of them: as the caller sent them (``sent``: their
    bytes, :func:`core.inputs.decode_object`) when those are on one line, else encoded."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    # (an SSE data line holds no line break)
    if sent is not None and sent.find(b"\n") < 0 and sent.find(b"\r") < 0:
        return sent
    return _encode(tools)


def shell(body: dict[str, Any], model_id: str, tools: bytes | None = None) -> dict[str, Any]:
    """The Response object before any output; requested options are echoed as the API does. The tools
    and instructions echoed, the request's largest parts (Codex: 30 tools and its whole prompt), are
    encoded once, as :class:`msgspec.Raw`, for the stream's three snapshots of the response and the
    stored one (``tools``: already encoded, :func:`encoded_tools`)."""
    asked = body.get("reasoning")
    reasoning = asked if isinstance(asked, dict) else {}
    instructions = body.get("instructions")
    if tools is None:
        tools = encoded_tools(body)
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": msgspec.Raw(_encode(instructions)) if instructions else instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": model_id,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "service_tier": "default",
        "store": body.get("store") is not False,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": msgspec.Raw(tools) if tools else body.get("tools") or [],
        "top_logprobs": 0,
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def from_completion(
    completion: dict[str, Any], response: dict[str, Any], how: Options | None = None
) -> dict[str, Any]:
    """A chat.completion → the finished Response object (``response`` is its :func:`shell`)."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return whole(
        response,
        message if isinstance(message, dict) else {},
        choice.get("finish_reason"),
        completion.get("usage"),
        how,
    )
