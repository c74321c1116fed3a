"""Emulator of OpenAI's Responses API, ``POST /v1/responses`` (docs/providers.md, OpenAI Responses), served by the
``openai`` flavour of :class:`emulators.openai.OpenAIEmulator`.

It validates like the real API (unknown parameters, ``max_output_tokens`` ≥ 16, flat function tools,
a ``function_call_output`` must answer a call it knows, ``previous_response_id`` must name a stored
response), keeps responses in memory unless ``store: false``, answers with a real Response object or
the typed event stream (``event:`` lines, ``sequence_number``, no ``[DONE]``), and takes the fault
directives of :mod:`emulators.directives`: ``[cut:N]`` drops the connection after N delta events,
``[midfail]`` ends with ``response.failed`` after the first delta, ``[malformed]`` breaks one event.
Reasoning models (``o*``, ``gpt-5*``) and ``[think]`` put a reasoning item first.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from emulators.common import decode, encode, nth, pause, play, random_id
from emulators.directives import (
    Directives,
    count_tokens,
    directives,
    reply_pieces,
    structured_pieces,
)
from emulators.host import Host

# ResponseCreateParams of the openai SDK (3.57: src/openai/types/responses/response_create_params.py), and
# client_metadata, which the API takes and Codex sends on every call
KNOWN = frozenset(
    """model input instructions max_output_tokens max_tool_calls temperature top_p tools tool_choice
    parallel_tool_calls stream stream_options text reasoning include metadata previous_response_id conversation
    store truncation user safety_identifier prompt_cache_key prompt_cache_retention service_tier background
    prompt top_logprobs context_management access_programs background_options image moderation
    prompt_cache_options client_metadata""".split()
)
# the tool union (ToolParam) but function and namespace
HOSTED_TOOLS = frozenset(
    """web_search web_search_2025_08_26 web_search_preview web_search_preview_2025_03_11 file_search
    code_interpreter computer computer_use_preview image_generation mcp local_shell shell apply_patch custom
    tool_search programmatic_tool_calling""".split()
)
MAX_STORED = 500


class Invalid(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _missing(param: str) -> Invalid:
    return Invalid(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _wrong_type(param: str, expected: str) -> Invalid:
    """As the API answers a field of the wrong JSON type."""
    return Invalid(
        400,
        f"Invalid type for '{param}': expected {expected}, but got a value of another type instead.",
        param,
        "invalid_type",
    )


def _rid(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p)
    return ""


@dataclass
class ResponseAnswer:
    d: Directives
    items: list[dict[str, Any]]  # the output items, final state
    pieces: list[str]  # the message text, as stream deltas
    usage: dict[str, Any]
    incomplete: bool
    call_ids: list[str] = field(default_factory=list)


# fields the handler reads, with the JSON types the API accepts for them
_TYPES: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("previous_response_id", (str,), "a string"),
    ("instructions", (str,), "a string"),
    ("input", (str, list), "a string or an array"),
    ("tools", (list,), "an array"),
    ("tool_choice", (str, dict), "a string or an object"),
    ("text", (dict,), "an object"),
    ("reasoning", (dict,), "an object"),
    ("metadata", (dict,), "an object"),
    ("store", (bool,), "a boolean"),
    ("stream", (bool,), "a boolean"),
    ("background", (bool,), "a boolean"),
    ("parallel_tool_calls", (bool,), "a boolean"),
    ("user", (str,), "a string"),
)


class ResponsesHandler:
    """``emulator`` is the OpenAIEmulator that owns the app: its key, error envelope, request log."""

    def __init__(self, emulator: Host) -> None:
        self.emu = emulator
        self.stored: OrderedDict[str, dict[str, Any]] = OrderedDict()  # id → {"tokens", "call_ids"}

    # -- validation ------------------------------------------------------------------------------
    def _validate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        unknown = sorted(set(body) - KNOWN)
        if unknown:
            raise Invalid(400, f"Unknown parameter: '{unknown[0]}'.", unknown[0], "unknown_parameter")
        if not isinstance(body.get("model"), str):
            raise _missing("model")
        for name, kinds, expected in _TYPES:  # as the API answers a field of the wrong type
            value = body.get(name)
            if value is not None and (
                not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds
            ):
                raise _wrong_type(name, expected)
        cap = body.get("max_output_tokens")
        if cap is not None and (not isinstance(cap, int) or cap < 16):
            raise Invalid(
                400,
                f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {cap} instead.",
                "max_output_tokens",
                "integer_below_min_value",
            )
        temperature = body.get("temperature")
        if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 2):
            raise Invalid(
                400, "Invalid 'temperature': decimal out of range [0, 2].", "temperature", "invalid_value"
            )
        if body["model"].startswith(("o1", "o3", "o4", "gpt-5")) and "chat" not in body["model"]:
            for name in ("temperature", "top_p"):  # reasoning models take only the default
                if body.get(name) is not None and body[name] != 1:
                    raise Invalid(
                        400,
                        f"Unsupported parameter: '{name}' is not supported with this model.",
                        name,
                        "unsupported_parameter",
                    )
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict):
                raise _wrong_type(f"tools[{i}]", "an object")
            kind = tool.get("type")
            if kind is None:
                raise _missing(f"tools[{i}].type")
            if not isinstance(kind, str):
                raise _wrong_type(f"tools[{i}].type", "a string")
            if kind == "function" and not isinstance(tool.get("name"), str):
                raise _missing(f"tools[{i}].name")
            if kind == "namespace":  # NamespaceToolParam: a name, a description and function tools
                for field in ("name", "description", "tools"):
                    if field not in tool:
                        raise _missing(f"tools[{i}].{field}")
                if not isinstance(tool["tools"], list):
                    raise _wrong_type(f"tools[{i}].tools", "an array")
                for j, inner in enumerate(tool["tools"]):
                    if (
                        not isinstance(inner, dict)
                        or inner.get("type") != "function"
                        or not isinstance(inner.get("name"), str)
                    ):
                        raise Invalid(
                            400,
                            f"Invalid value for 'tools[{i}].tools[{j}]': a namespace holds function tools.",
                            f"tools[{i}].tools[{j}]",
                            "invalid_value",
                        )
                continue
            if kind != "function" and kind not in HOSTED_TOOLS:
                raise Invalid(
                    400,
                    f"Invalid value: '{kind}'. Supported values are: 'function', 'web_search', ...",
                    f"tools[{i}].type",
                    "invalid_value",
                )
        given = body.get("input")
        if given is None and body.get("previous_response_id") is None and body.get("prompt") is None:
            raise _missing("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        for i, item in enumerate(items):
            self._validate_item(item, f"input[{i}]")
        return items

    def _validate_item(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise Invalid(400, f"Invalid type for '{where}': expected an object.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") not in ("user", "assistant", "system", "developer"):
            raise Invalid(
                400,
                f"Invalid value: '{item.get('role')}'. Supported values are: 'assistant', 'system', 'developer', and 'user'.",
                f"{where}.role",
                "invalid_value",
            )
        content = item.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            image = isinstance(part, dict) and part.get("type") == "input_image"
            if image and not (part.get("image_url") or part.get("file_id")):
                raise _missing(f"{where}.content[{j}].image_url")
        if kind in ("function_call", "function_call_output") and not isinstance(item.get("call_id"), str):
            raise _missing(f"{where}.call_id")

    def _check_chain(self, body: dict[str, Any], items: list[dict[str, Any]]) -> int:
        """Tokens carried over from ``previous_response_id``; every function output must answer a call."""
        known: set[str] = {i["call_id"] for i in items if i.get("type") == "function_call"}
        carried = 0
        previous = body.get("previous_response_id")
        if previous is not None:
            stored = self.stored.get(previous)
            if stored is None:
                raise Invalid(
                    404,
                    f"Previous response with id '{previous}' not found.",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            carried = stored["tokens"]
            known |= set(stored["call_ids"])
        for item in items:
            if item.get("type") == "function_call_output" and item["call_id"] not in known:
                raise Invalid(
                    400,
                    f"No tool call found for function call output with call_id {item['call_id']}.",
                    "input",
                )
        return carried

    # -- the answer -----------------------------------------------------------------------------
    def _plan(self, body: dict[str, Any], items: list[dict[str, Any]], carried: int) -> ResponseAnswer:
        users = [i for i in items if i.get("type", "message") == "message" and i.get("role") == "user"]
        last_user: dict[str, Any] = users[-1] if users else {}
        d = directives(_text(last_user.get("content")))
        texts = [_text(i.get("content")) or str(i.get("output") or i.get("arguments") or "") for i in items]
        images = sum(
            1
            for i in items
            if isinstance(i.get("content"), list)
            for p in i["content"]
            if isinstance(p, dict) and p.get("type") == "input_image"
        )
        instructions = str(body.get("instructions") or "")
        input_tokens = carried + sum(count_tokens(t) + 3 for t in texts) + 3 + 85 * images
        input_tokens += count_tokens(instructions) + 3 if instructions else 0
        model = str(body["model"])
        thinking = (
            ["Let", " me", " think", "."] if d.think or model.startswith(("o1", "o3", "o4", "gpt-5")) else []
        )
        last = items[-1] if items else {}
        if last.get("type") == "function_call_output":
            d.echo, d.text = True, f"The tool returned: {last.get('output')}"
        cap = body.get("max_output_tokens")
        fmt = (body.get("text") or {}).get("format")
        if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object") and not d.echo:
            pieces, incomplete = structured_pieces(fmt.get("schema"), cap - len(thinking) if cap else None)
        else:
            pieces, incomplete = reply_pieces(
                " ".join([instructions, *texts]), d, cap - len(thinking) if cap else None
            )
        out: list[dict[str, Any]] = []
        if thinking:
            summary = (
                [{"type": "summary_text", "text": "".join(thinking)}]
                if (body.get("reasoning") or {}).get("summary")
                else []
            )
            item: dict[str, Any] = {"id": _rid("rs"), "type": "reasoning", "summary": summary}
            # the reasoning, opaque, to send back
            if "reasoning.encrypted_content" in (body.get("include") or ()):
                item["encrypted_content"] = "gAAAAA" + secrets.token_urlsafe(48)
            out.append(item)
        call = self._tool_call(body, d, last)
        if call is not None:
            out.append(call)
            pieces, incomplete = [], False
        else:
            part = {"type": "output_text", "text": "".join(pieces), "annotations": [], "logprobs": []}
            out.append(
                {
                    "id": _rid("msg"),
                    "type": "message",
                    "status": "incomplete" if incomplete else "completed",
                    "content": [part],
                    "role": "assistant",
                }
            )
        output_tokens = len(pieces) + len(thinking) + (count_tokens(call["arguments"]) + 4 if call else 0)
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": len(thinking)},
            "total_tokens": input_tokens + output_tokens,
        }
        return ResponseAnswer(d, out, pieces, usage, incomplete, [call["call_id"]] if call else [])

    def _tool_call(self, body: dict[str, Any], d: Directives, last: dict[str, Any]) -> dict[str, Any] | None:
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        choice = body.get("tool_choice")
        named = isinstance(choice, dict) and choice.get("type") == "function"
        if not tools or last.get("type") == "function_call_output" or choice == "none":
            return None
        if not (d.tool or choice == "required" or named):
            return None
        wanted = choice.get("name") if isinstance(choice, dict) else None
        tool = next(
            (t for t in tools if named and t["name"] == wanted),
            tools[d.tool_index([t["name"] for t in tools])],
        )
        return {
            "id": _rid("fc"),
            "type": "function_call",
            "status": "completed",
            "arguments": encode(d.arguments(tool["name"], tool.get("parameters"))).decode(),
            "call_id": "call_" + random_id(24),
            "name": tool["name"],
        }

    def _response(self, body: dict[str, Any], rid: str, created: int) -> dict[str, Any]:
        reasoning = body.get("reasoning") or {}
        tools = [{"strict": True, **t} if t.get("type") == "function" else t for t in body.get("tools") or []]
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": body["model"],
            "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": body.get("safety_identifier"),
            "service_tier": "default",
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": tools,
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": None,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    def _final(self, response: dict[str, Any], plan: ResponseAnswer) -> dict[str, Any]:
        final = {**response, "output": plan.items, "usage": plan.usage}
        if plan.incomplete:
            final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        else:
            final.update(status="completed", completed_at=int(time.time()))
        return final

    async def handle(self, request: web.Request) -> web.StreamResponse:
        emu = self.emu
        if request.headers.get("Authorization") != f"Bearer {emu.api_key}":
            return emu.error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        try:
            body = decode(await request.read())
        except msgspec.DecodeError:
            return emu.error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error"
            )
        if not isinstance(body, dict):
            return emu.error(400, "The body must be a JSON object.", "invalid_request_error")
        emu.received(body)
        try:
            items = self._validate(body)
            plan = self._plan(body, items, self._check_chain(body, items))
        except Invalid as exc:
            return web.Response(
                status=exc.status,
                content_type="application/json",
                body=encode(
                    {
                        "error": {
                            "message": exc.message,
                            "type": "invalid_request_error",
                            "param": exc.param,
                            "code": exc.code,
                        }
                    }
                ),
            )
        await pause(plan.d.slow_ms)
        flaky = emu.flakiness.fault("responses:" + plan.d.text, plan.d)
        if flaky == 429:
            return emu.error(
                429,
                "Rate limit reached for requests",
                "requests",
                "rate_limit_exceeded",
                {"retry-after": "0.1"},
            )
        if plan.d.fault or flaky:
            return emu.fault(plan.d.fault or flaky or 500)
        response = self._response(body, _rid("resp"), int(time.time()))
        if response["store"]:
            self.stored[response["id"]] = {"tokens": plan.usage["total_tokens"], "call_ids": plan.call_ids}
            while len(self.stored) > MAX_STORED:
                self.stored.popitem(last=False)
        headers = {"x-request-id": "req_" + random_id(16)}
        if body.get("stream"):
            return await self._stream(request, response, plan, headers)
        if plan.d.malformed:
            return web.Response(body=b'{"id": "resp_broken", "output": [', content_type="application/json")
        return web.Response(
            body=encode(self._final(response, plan)), content_type="application/json", headers=headers
        )

    # -- streaming ------------------------------------------------------------------------------
    def _events(self, response: dict[str, Any], plan: ResponseAnswer) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": response},
            {"type": "response.in_progress", "response": response},
        ]
        for index, item in enumerate(plan.items):
            events += _item_events(index, item, plan.pieces)
        kind = "response.incomplete" if plan.incomplete else "response.completed"
        events.append({"type": kind, "response": self._final(response, plan)})
        for number, event in enumerate(events):
            event["sequence_number"] = number
        return events

    async def _stream(
        self, request: web.Request, response: dict[str, Any], plan: ResponseAnswer, headers: dict[str, str]
    ) -> web.StreamResponse:
        out = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **headers,
            }
        )
        await out.prepare(request)
        d, events = plan.d, self._events(response, plan)
        deltas = [event["type"].endswith(".delta") for event in events]
        frames: list[bytes] = []
        for event, is_delta in zip(events, deltas, strict=True):
            data = encode(event)
            if is_delta and d.malformed and not any(deltas[: len(frames)]):
                data = data[: len(data) // 2]
            frames.append(b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n")
        second = nth(deltas, 2)
        fail = (
            (second - 1, self._failed(response, events[second - 1]["sequence_number"]))
            if d.midfail and second
            else None
        )
        cut_after = nth(deltas, max(d.cut, 1)) if d.cut is not None else None
        ended, written = await play(request, out, frames, d, cut_after, fail)
        if ended in ("complete", "disconnected"):
            self.emu.streams = [*self.emu.streams[-49:], (ended, written)]
        return out

    def _failed(self, response: dict[str, Any], sequence: int) -> bytes:
        error = {"code": "server_error", "message": "The server had an error while processing your request."}
        event = {
            "type": "response.failed",
            "sequence_number": sequence,
            "response": {**response, "status": "failed", "error": error},
        }
        return b"event: response.failed\ndata: " + encode(event) + b"\n\n"


def _item_events(index: int, item: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    """The events of one output item, ``output_item.added`` to ``output_item.done``."""
    kind, at = item["type"], {"item_id": item["id"], "output_index": index}
    if kind == "message":
        added = {**item, "status": "in_progress", "content": []}
    elif kind == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
    else:
        added = {**item, "summary": []}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": added}
    ]
    if kind == "message":
        part = item["content"][0]
        events.append(
            {"type": "response.content_part.added", **at, "content_index": 0, "part": {**part, "text": ""}}
        )
        events += [
            {"type": "response.output_text.delta", **at, "content_index": 0, "delta": p, "logprobs": []}
            for p in pieces
        ]
        events.append(
            {
                "type": "response.output_text.done",
                **at,
                "content_index": 0,
                "text": part["text"],
                "logprobs": [],
            }
        )
        events.append({"type": "response.content_part.done", **at, "content_index": 0, "part": part})
    elif kind == "function_call":
        half = len(item["arguments"]) // 2
        for delta in (item["arguments"][:half], item["arguments"][half:]):
            events.append({"type": "response.function_call_arguments.delta", **at, "delta": delta})
        events.append(
            {
                "type": "response.function_call_arguments.done",
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        )
    else:
        for n, summary in enumerate(item["summary"]):
            where = {**at, "summary_index": n}
            events.append(
                {
                    "type": "response.reasoning_summary_part.added",
                    **where,
                    "part": {"type": "summary_text", "text": ""},
                }
            )
            events.append(
                {"type": "response.reasoning_summary_text.delta", **where, "delta": summary["text"]}
            )
            events.append({"type": "response.reasoning_summary_text.done", **where, "text": summary["text"]})
            events.append({"type": "response.reasoning_summary_part.done", **where, "part": summary})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events
