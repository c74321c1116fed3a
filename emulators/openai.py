"""Emulator of the OpenAI Chat Completions protocol in three flavours: ``openai``, ``upstage``
(Solar: reasoning trace in ``reasoning``) and ``mistral`` (flat error envelope, usage always on the
finish chunk, 422 on fields Mistral's API does not take, 9-character tool-call ids, thinking chunks).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from emulators.common import Emulator, decode, encode, pause, play, random_id, retry_after
from emulators.directives import (
    Directives,
    Flakiness,
    count_tokens,
    directives,
    reply_pieces,
    structured_pieces,
)
from emulators.embeddings import OpenAIEmbeddings
from emulators.images import OpenAIImages
from emulators.openai_responses import ResponsesHandler

ORGANIZATION = "org-3mUlAt3dG4tewayAcc0unt1"  # the account's organization, named in its rate-limit errors

MISTRAL_FIELDS = {
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "stream",
    "stop",
    "random_seed",
    "response_format",
    "tools",
    "tool_choice",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "prediction",
    "parallel_tool_calls",
    "safe_prompt",
    "prompt_mode",
    "reasoning_effort",
    "metadata",
    "guardrails",
    "prompt_cache_key",
}


def _call_text(call: dict[str, Any]) -> str:
    """A tool call's arguments (function) or free-form input (custom)."""
    return str(call["custom"]["input"] if call["type"] == "custom" else call["function"]["arguments"])


async def _cut_body(request: web.Request, data: bytes) -> web.StreamResponse:
    """Headers promising ``data``, half of it, then the connection closed (the [cut] directive)."""
    response = web.StreamResponse(
        headers={"Content-Type": "application/json", "Content-Length": str(len(data))}
    )
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    if request.transport is not None:
        request.transport.close()
    return response


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class OpenAIEmulator(Emulator):
    def __init__(
        self,
        flavour: str = "openai",
        api_key: str = "emu-key",
        rpm: int = 0,
        tpm: int = 0,
        ms_per_token: int = 0,
    ) -> None:
        assert flavour in ("openai", "upstage", "mistral")
        super().__init__(api_key, max_body=64 * 1024 * 1024, rpm=rpm)
        self.flavour = flavour
        self.tpm = tpm  # the account's tokens per minute: a chat call asking for more is refused whole
        # how fast this account generates (deployments differ: regions, tiers): a chat answer takes this
        # long per output token, a non-stream one before it answers, a stream between its events
        self.ms_per_token = ms_per_token
        self.streams: list[tuple[str, int]] = []  # ("complete" | "disconnected", events written)
        self.flakiness = Flakiness()
        self.routes()

    def routes(self) -> None:
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/embeddings", OpenAIEmbeddings(self).handle)
        if self.flavour == "openai":  # only OpenAI serves the Responses API
            self.responses = ResponsesHandler(self)
            self.app.router.add_post("/v1/responses", self.responses.handle)
            images = OpenAIImages(self)
            self.app.router.add_post("/v1/images/generations", images.generations)
            self.app.router.add_post("/v1/images/edits", images.edits)

    # -- errors in the flavour's envelope ---------------------------------------------------------
    def error(
        self, status: int, message: str, type_: str, code: str | None = None, headers: dict | None = None
    ) -> web.Response:
        if self.flavour == "mistral":
            body: dict[str, Any] = {
                "object": "error",
                "message": message,
                "type": type_,
                "param": None,
                "code": code,
            }
        else:
            body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
        return web.Response(
            status=status, body=encode(body), content_type="application/json", headers=headers
        )

    def fault(self, status: int) -> web.Response:
        if status == 402:  # out of credit: a 429 that is not a rate limit
            return self.error(
                429,
                "You exceeded your current quota, please check your plan and billing details. For "
                "more information on this error, read the docs: "
                "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                "insufficient_quota",
                "insufficient_quota",
            )
        if status == 429:
            return self.rate_limited(1.0)
        if status == 529:
            return self.error(529, "The server is overloaded", "server_error")
        return self.error(status, "The server had an error while processing your request.", "server_error")

    def rate_limited(self, wait: float) -> web.Response:
        """429 over the request rate limit, with the wait in retry-after (whole seconds)."""
        limit = self.limit.rpm or 1  # (the real message names the account's organization and its usage)
        return self.error(
            429,
            f"Rate limit reached for requests in organization {ORGANIZATION} on requests per "
            f"min (RPM): Limit {limit}, Used {limit}, Requested 1. Please try again in {wait:.3f}s. "
            "Visit https://platform.openai.com/account/rate-limits to learn more.",
            "requests",
            "rate_limit_exceeded",
            {"retry-after": retry_after(wait), "x-ratelimit-remaining-requests": "0"},
        )

    def too_large(self, model: str, requested: int) -> web.Response:
        """429 for one request over the account's whole TPM: OpenAI's "Request too large" (type
        ``tokens``), which no wait cures (the same request always gets it)."""
        return self.error(
            429,
            f"Request too large for {model} in organization {ORGANIZATION} on tokens per min "
            f"(TPM): Limit {self.tpm}, Requested {requested}. The input or output tokens must be "
            "reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits "
            "to learn more.",
            "tokens",
            "rate_limit_exceeded",
        )

    def _authorised(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self.error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        return web.json_response({"object": "list", "data": []})

    # -- chat -------------------------------------------------------------------------------------
    def _validate(self, body: dict[str, Any]) -> web.Response | None:
        if (
            not isinstance(body.get("model"), str)
            or not isinstance(body.get("messages"), list)
            or not body["messages"]
        ):
            return self.error(
                400, "'model' and a non-empty 'messages' are required.", "invalid_request_error"
            )
        model = body["model"]
        if self.flavour == "mistral":
            extra = sorted(set(body) - MISTRAL_FIELDS)
            if extra:
                detail = [
                    {"type": "extra_forbidden", "loc": ["body", f], "msg": "Extra inputs are not permitted"}
                    for f in extra
                ]
                return web.Response(
                    status=422, body=encode({"detail": detail}), content_type="application/json"
                )
            for message in body["messages"]:
                ids = [c.get("id", "") for c in message.get("tool_calls") or []]
                if message.get("role") == "tool":
                    ids.append(message.get("tool_call_id", ""))
                for tid in ids:
                    if not (len(tid) == 9 and tid.isalnum()):
                        return self.error(
                            400,
                            f"Tool call id was {tid} but must be a-z, A-Z, 0-9, with a length of 9.",
                            "invalid_request_error",
                        )
        # OpenAI's reasoning models; its chat-latest models are not (they take max_tokens and sampling)
        reasoning = self.flavour == "openai" and model.startswith(("o", "gpt-5")) and "chat" not in model
        if reasoning and "max_tokens" in body:
            return self.error(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                "invalid_request_error",
                "unsupported_parameter",
            )
        if reasoning:
            refused = self._reasoning_sampling(body)
            if refused is not None:
                return refused
        if body.get("stream_options") is not None and not body.get("stream"):
            return self.error(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "invalid_request_error",
            )
        return None

    def _reasoning_sampling(self, body: dict[str, Any]) -> web.Response | None:
        """Reasoning models take only the default sampling: OpenAI's 400s for what they refuse."""
        if body.get("temperature") not in (None, 1):
            return self.error(
                400,
                f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                "model. Only the default (1) value is supported.",
                "invalid_request_error",
                "unsupported_value",
            )
        for name in (
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "logprobs",
            "top_logprobs",
            "logit_bias",
            "stop",
        ):
            if body.get(name) is not None:
                return self.error(
                    400,
                    f"Unsupported parameter: '{name}' is not supported with this model.",
                    "invalid_request_error",
                    "unsupported_parameter",
                )
        return None

    def _plan(
        self, body: dict[str, Any]
    ) -> tuple[Directives, list[list[str]], str, dict[str, Any] | None, int, bool]:
        """(directives, the answer's pieces per choice, finish reason, tool call, prompt tokens, reasoning)."""
        messages = body["messages"]
        last_user: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        d = directives(_text(last_user.get("content")))
        prompt = " ".join(_text(m.get("content")) for m in messages)
        prompt_tokens = sum(count_tokens(_text(m.get("content"))) + 3 for m in messages) + 3
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        tools = body.get("tools") or []
        if tools:  # tool definitions are billed as input, as OpenAI counts them
            prompt_tokens += count_tokens(encode(tools).decode())
        choice = body.get("tool_choice")
        tool_call = None
        if (
            tools
            and messages[-1].get("role") != "tool"
            and choice != "none"
            and (d.tool or choice in ("required", "any") or isinstance(choice, dict))
        ):
            fn = tools[d.tool_index([t.get("function", {}).get("name") for t in tools])].get("function", {})
            if isinstance(choice, dict) and choice.get("type") != "custom":
                fn = next(
                    (
                        t["function"]
                        for t in tools
                        if t.get("function", {}).get("name") == choice.get("function", {}).get("name")
                    ),
                    fn,
                )
            call_id = random_id(9) if self.flavour == "mistral" else "call_" + random_id(24)
            tool_call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": fn.get("name", "tool"),
                    "arguments": encode(d.arguments(fn.get("name", "tool"), fn.get("parameters"))).decode(),
                },
            }
            custom = tools[0].get("custom") if tools[0].get("type") == "custom" else None
            if isinstance(choice, dict) and choice.get("type") == "custom":
                custom = next(
                    (
                        t["custom"]
                        for t in tools
                        if t.get("custom", {}).get("name") == choice.get("custom", {}).get("name")
                    ),
                    custom,
                )
            if self.flavour == "openai" and isinstance(custom, dict):  # a custom tool: free-form text input
                tool_call = {
                    "id": call_id,
                    "type": "custom",
                    "custom": {"name": custom.get("name", "tool"), "input": "print('hello')"},
                }
        if messages[-1].get("role") == "tool":
            d.echo, d.text = True, f"The tool returned: {_text(messages[-1].get('content'))}"
        fmt = body.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        replies: list[list[str]] = []
        truncated = False
        for i in range(body.get("n") or 1):  # n choices, each its own answer
            if kind in ("json_schema", "json_object") and not d.echo:  # structured output: JSON of the schema
                spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
                pieces, cut = structured_pieces(
                    spec.get("schema") if isinstance(spec, dict) else None, cap, i
                )
            else:
                pieces, cut = reply_pieces(prompt + (f"#{i}" if i else ""), d, cap)
            replies.append(pieces)
            truncated = truncated or cut
        reasoning = d.think or (
            self.flavour == "upstage" and body.get("reasoning_effort") in ("low", "medium", "high")
        )
        reasoning = reasoning or (
            self.flavour == "mistral" and str(body.get("model", "")).startswith("magistral")
        )
        return d, replies, ("length" if truncated else "stop"), tool_call, prompt_tokens, reasoning

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return self.error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        return await self.answer(request, body)

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object (recorded), or the error answer."""
        try:
            body = decode(await request.read())
        except msgspec.DecodeError:
            return self.error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error"
            )
        if not isinstance(body, dict):
            return self.error(400, "The body must be a JSON object.", "invalid_request_error")
        self.received(body, request.headers)
        return body

    async def answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        wait = self.over_limit()
        if wait is not None:
            return self.rate_limited(wait)
        invalid = self._validate(body)
        if invalid is not None:
            return invalid
        d, replies, finish, tool_call, prompt_tokens, reasoning = self._plan(body)
        requested = prompt_tokens + int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
        if self.tpm and requested > self.tpm:
            return self.too_large(str(body["model"]), requested)
        await pause(d.slow_ms)
        flaky = self.flakiness.fault(_text(body["messages"][-1].get("content")), d)
        if flaky == 429:
            return self.error(
                429,
                "Rate limit reached for requests",
                "requests",
                "rate_limit_exceeded",
                {"retry-after": "0.1"},
            )
        if d.fault == 402 and self.flavour != "openai":
            d.fault = None  # out of credit: only OpenAI's way of saying it is known (and emulated)
        if d.fault or flaky:
            return self.fault(d.fault or flaky or 500)
        thinking = ["Let", " me", " think", "."] if reasoning else []
        call_text = _call_text(tool_call) if tool_call else ""
        per_choice = len(thinking) + (count_tokens(call_text) + 4 if tool_call else 0)
        completion_tokens = sum(len(pieces) for pieces in replies) + per_choice * len(replies)
        if tool_call:
            replies, finish = [[] for _ in replies], "tool_calls"
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if self.flavour != "mistral":
            usage["prompt_tokens_details"] = {"cached_tokens": 0, "audio_tokens": 0}
            usage["completion_tokens_details"] = {"reasoning_tokens": len(thinking), "audio_tokens": 0}
        cid = random_id(32, "0123456789abcdef") if self.flavour == "mistral" else "chatcmpl-" + random_id(24)
        created = int(time.time())
        if self.ms_per_token and body.get("stream"):
            d.delay_ms += self.ms_per_token
        elif self.ms_per_token:
            await pause(self.ms_per_token * completion_tokens)
        if body.get("stream"):
            return await self._stream(
                request, body, d, cid, created, replies, thinking, finish, tool_call, usage
            )
        if d.malformed:
            return web.Response(body=b'{"id": "broken", "choices": [', content_type="application/json")
        choices = [
            {
                "index": i,
                "message": self._message(pieces, thinking, tool_call, i),
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, pieces in enumerate(replies)
        ]
        out = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body["model"],
            "choices": choices,
            "usage": usage,
        }
        if self.flavour == "openai":
            out["system_fingerprint"] = "fp_emulator"
            out["service_tier"] = "default"
        self.annotate(out)
        data = encode(out)
        if d.cut is not None:  # the connection drops after part of the body
            return await _cut_body(request, data)
        return web.Response(
            body=data, content_type="application/json", headers={"x-request-id": "req_" + random_id(16)}
        )

    def _message(
        self, pieces: list[str], thinking: list[str], tool_call: dict[str, Any] | None, index: int
    ) -> dict[str, Any]:
        """One choice's message as the flavour writes it (Mistral: a tool call has no ``type`` and an ``index``)."""
        message: dict[str, Any] = {"role": "assistant", "content": None if tool_call else "".join(pieces)}
        if tool_call:
            call = {
                **tool_call,
                "id": tool_call["id"] if index == 0 else tool_call["id"][:-2] + f"{index:02d}",
            }
            # as Mistral's API answers (client-python: ToolCall type is optional)
            if self.flavour == "mistral":
                call = {"function": call["function"], "id": call["id"], "index": 0}
            message["tool_calls"] = [call]
        if thinking:
            if self.flavour == "mistral":
                message["content"] = [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "".join(thinking)}]},
                    {"type": "text", "text": message["content"] or ""},
                ]
            else:
                message["reasoning" if self.flavour == "upstage" else "reasoning_content"] = "".join(thinking)
        if self.flavour == "openai":
            message["refusal"] = None
            message["annotations"] = []
        return message

    def annotate(self, out: dict[str, Any]) -> None:
        """An answer or a stream chunk as built, before it is sent (a flavour may add its fields)."""

    def preamble(self) -> list[bytes]:
        """Stream events before the first chunk."""
        return []

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        d: Directives,
        cid: str,
        created: int,
        replies: list[list[str]],
        thinking: list[str],
        finish: str,
        tool_call: dict[str, Any] | None,
        usage: dict[str, Any],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-request-id": "req_" + random_id(16),
            }
        )
        await response.prepare(request)
        include_usage = self.flavour == "mistral" or bool(
            (body.get("stream_options") or {}).get("include_usage")
        )
        mistral = self.flavour == "mistral"

        def event(
            delta: dict[str, Any] | None,
            finish_reason: str | None = None,
            last_usage: Any = None,
            empty: bool = False,
            index: int = 0,
        ) -> bytes:
            chunk: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body["model"],
                "choices": []
                if empty
                else [{"index": index, "delta": delta or {}, "finish_reason": finish_reason}],
            }
            if not mistral and not empty:
                chunk["choices"][0]["logprobs"] = None
            if include_usage and not mistral:
                chunk["usage"] = last_usage
            elif mistral and last_usage is not None:
                chunk["usage"] = last_usage
            self.annotate(chunk)
            return b"data: " + encode(chunk) + b"\n\n"

        lead = self.preamble()
        events: list[bytes] = [*lead, event({"role": "assistant", "content": ""})]
        events += [event({"role": "assistant", "content": ""}, index=i) for i in range(1, len(replies))]
        for piece in thinking:
            if mistral:
                events.append(
                    event({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": piece}]}]})
                )
            else:
                events.append(
                    event({"reasoning" if self.flavour == "upstage" else "reasoning_content": piece})
                )
        if tool_call:
            kind = tool_call["type"]
            args, field = _call_text(tool_call), "arguments" if kind == "function" else "input"
            half = len(args) // 2
            first = {
                "index": 0,
                "id": tool_call["id"],
                "type": kind,
                kind: {"name": tool_call[kind]["name"], field: ""},
            }
            if mistral:  # Mistral's deltas carry no type
                del first["type"]
            events.append(event({"tool_calls": [first]}))
            events.append(event({"tool_calls": [{"index": 0, kind: {field: args[:half]}}]}))
            events.append(event({"tool_calls": [{"index": 0, kind: {field: args[half:]}}]}))
        for step in range(max(len(pieces) for pieces in replies)):  # the choices' pieces interleaved
            events += [
                event({"content": pieces[step]}, index=i)
                for i, pieces in enumerate(replies)
                if step < len(pieces)
            ]
        events += [event({}, finish, index=i) for i in range(1, len(replies))]
        if mistral:
            events.append(event({}, finish, usage))
        else:
            events.append(event({}, finish))
            if include_usage:
                events.append(event(None, last_usage=usage, empty=True))
        events.append(b"data: [DONE]\n\n")
        if d.malformed and len(events) > 2 + len(lead):
            events[2 + len(lead)] = b'data: {"id": "broken", "choices": [\n\n'
        fail = (
            (
                2 + len(lead),
                b'data: {"error": {"message": "The server had an error while processing your request.", "type": "server_error", "param": null, "code": null}}\n\n',
            )
            if d.midfail
            else None
        )
        ended, written = await play(
            request, response, events, d, d.cut + 1 + len(lead) if d.cut is not None else None, fail
        )
        if ended in ("complete", "disconnected"):
            self.streams = [*self.streams[-49:], (ended, written)]
        return response
