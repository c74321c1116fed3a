"""Emulator of the Gemini API (Generative Language API ``v1beta``, docs/providers.md, Gemini).

Serves ``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent`` (with ``alt=sse``:
data-only events, CRLF line ends, no ``[DONE]``, the connection simply closes; without ``alt``: one
JSON array), ``:countTokens``, and ``GET /v1beta/models[/{model}]``. It checks the key
(``x-goog-api-key`` or ``?key=``), rejects unknown request fields, wrong roles and empty parts as the
real API does, and answers with ``usageMetadata`` running totals on every stream event.

Directives are the common ones (``emulators.directives``), plus ``[tool2]``: two parallel
function calls when two functions are offered. A ``functionResponse`` in the last user turn is
answered with "The tool returned: …". Thinking happens with ``[think]``, with
``thinkingConfig.includeThoughts``, and always on ``gemini-3`` models; thought parts are shown with
``[think]`` or ``includeThoughts``, and function calls of a thinking model carry a ``thoughtSignature``
that ``gemini-3`` models require back on the next turn.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from emulators.common import Emulator, decode, encode, pause, play, random_id, retry_after
from emulators.directives import (
    Directives,
    count_tokens,
    directives,
    reply_pieces,
    structured_pieces,
)
from emulators.embeddings import gemini_embed
from emulators.images import imagen_predict

ROOT = "/v1beta"
THOUGHT = ["Let", " me", " think", "."]
IMAGE_TOKENS = 258  # what Gemini counts for one image up to 384 px
IMAGE_OUT_TOKENS = 1290  # what Gemini counts (and bills as output) for one generated image
MEDIA_METHODS = ("embedContent", "batchEmbedContents", "predict")  # emulators/embeddings.py, images.py
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4f4YBAASZAcwPiojEAAAAAElFTkSuQmCC"  # a 1x1 PNG
SIGNATURE = "CiQBZW11bGF0b3IgdGhvdWdodCBzaWduYXR1cmUgZm9yIGdlbWluaQ=="  # base64, as the SDK checks
# name → (display name, input limit, output limit, thinks)
MODELS: dict[str, tuple[str, int, int, bool]] = {
    "gemini-3.5-flash": ("Gemini 3.5 Flash", 1048576, 65536, True),
    "gemini-3.1-pro-preview": ("Gemini 3.1 Pro Preview", 1048576, 65536, True),
    "gemini-3.1-flash-lite": ("Gemini 3.1 Flash-Lite", 1048576, 65536, True),
    "gemini-2.5-pro": ("Gemini 2.5 Pro", 1048576, 65536, True),
    "gemini-2.5-flash": ("Gemini 2.5 Flash", 1048576, 65536, True),
    "gemini-2.5-flash-lite": ("Gemini 2.5 Flash-Lite", 1048576, 65536, True),
    "gemini-3-pro-preview": ("Gemini 3 Pro Preview", 1048576, 65536, True),
    "gemini-2.0-flash": ("Gemini 2.0 Flash", 1048576, 8192, False),
    "gemini-2.0-flash-001": ("Gemini 2.0 Flash 001", 1048576, 8192, False),
    "gemini-2.5-flash-image-preview": ("Nano Banana", 32768, 32768, False),
    "gemini-flash-latest": ("Gemini Flash Latest", 1048576, 65536, True),
    "gemini-flash-lite-latest": ("Gemini Flash-Lite Latest", 1048576, 65536, True),
}
TOP_FIELDS = frozenset(
    "contents systemInstruction tools toolConfig safetySettings generationConfig cachedContent serviceTier "
    "store labels model".split()
)
CONFIG_FIELDS = frozenset(
    "temperature topP topK candidateCount maxOutputTokens stopSequences presencePenalty frequencyPenalty "
    "seed responseMimeType responseSchema responseJsonSchema responseLogprobs logprobs thinkingConfig "
    "responseModalities speechConfig mediaResolution imageConfig enableEnhancedCivicAnswers audioTimestamp "
    "enableAffectiveDialog".split()
)
PART_DATA = (
    "text inlineData fileData functionCall functionResponse executableCode codeExecutionResult".split()
)
ROLES = ("user", "model", "function", "tool")  # the last two: legacy spellings the real API still takes
QUOTA_METRIC = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")
_MODEL_NAME = re.compile(r"gemini-([\d.]+-)?(pro|flash|flash-lite)(-[\w.-]+)?")  # served beyond MODELS too


@functools.cache
def snake(name: str) -> str:
    return _SNAKE.sub("_", name).lower()


def get(obj: Any, name: str) -> Any:
    """A field by its camelCase name or its snake_case proto name (the API takes both)."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(name)
    return obj.get(snake(name)) if value is None else value


def error(code: int, message: str, status: str, details: list[dict[str, Any]] | None = None) -> web.Response:
    err: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        err["details"] = details
    return web.Response(status=code, body=encode({"error": err}), content_type="application/json")


def fault(status: int, retry_delay: str = "1s") -> web.Response:
    if status == 402:  # billing required (or the free tier is not offered in the caller's region)
        return error(
            400,
            "Gemini API free tier is not available in your country. Please enable billing on your "
            "project in Google AI Studio.",
            "FAILED_PRECONDITION",
        )
    if status == 429:
        return error(
            429,
            "You exceeded your current quota, please check your plan and billing details. For more "
            "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
            "RESOURCE_EXHAUSTED",
            [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": QUOTA_METRIC,
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                            "quotaValue": "10",
                        }
                    ],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [
                        {
                            "description": "Learn more about Gemini API quotas",
                            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                        }
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay},
            ],
        )
    if status in (503, 529):
        return error(503, "The model is overloaded. Please try again later.", "UNAVAILABLE")
    if status == 504:
        return error(504, "Deadline expired before operation could complete.", "DEADLINE_EXCEEDED")
    return error(
        500,
        "An internal error has occurred. Please retry or report in "
        "https://developers.generativeai.google/guide/troubleshooting",
        "INTERNAL",
    )


MIDFAIL = (  # what an in-band failure after the first event looks like
    b'{"error": {"code": 500, "message": "An internal error has occurred. Please retry or report in '
    b'https://developers.generativeai.google/guide/troubleshooting", "status": "INTERNAL"}}'
)


def _texts(content: Any) -> list[str]:
    return [
        t
        for p in get(content, "parts") or ()
        if isinstance(t := get(p, "text"), str) and not get(p, "thought")
    ]


def _tokens(part: Any) -> int:
    text = get(part, "text")
    if isinstance(text, str):
        return count_tokens(text)
    if get(part, "inlineData") or get(part, "fileData"):
        return IMAGE_TOKENS
    data = get(part, "functionCall") or get(part, "functionResponse")
    return count_tokens(encode(data).decode()) if data else 0


def _schema(declaration: dict[str, Any]) -> dict[str, Any]:
    """The parameters schema: JSON Schema, or Gemini's OpenAPI subset (upper-case type names, which
    emulators.schema_values reads as well)."""
    schema = get(declaration, "parametersJsonSchema") or get(declaration, "parameters") or {}
    return schema if isinstance(schema, dict) else {}


def _json_schema(config: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a JSON answer must follow (``responseJsonSchema``, else ``responseSchema``), if
    ``responseMimeType`` asks for JSON: ``{}`` for JSON without a schema, None for text."""
    if str(get(config, "responseMimeType") or "").lower() != "application/json":
        return None
    schema = get(config, "responseJsonSchema") or get(config, "responseSchema") or {}
    return schema if isinstance(schema, dict) else {}


def _tool_result(responses: list[dict[str, Any]]) -> str:
    out = []
    for fr in responses:
        response = get(fr, "response")
        value = (
            response.get("result", response.get("output"))
            if isinstance(response, dict) and len(response) == 1
            else None
        )
        out.append(value if isinstance(value, str) else encode(response).decode())
    return "The tool returned: " + "; ".join(out)


def _apply_stops(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        hits = [text.index(s) for s in stops if s and s in text]
        if hits:
            tail = piece[: len(piece) - (len(text) - min(hits))]
            return pieces[:i] + ([tail] if tail else []), True
    return pieces, False


@dataclass
class GeminiAnswer:
    """What one generateContent call answers."""

    model: str
    d: Directives
    candidates: list[list[str]]  # text pieces (one token each) per candidate
    finishes: list[str]
    calls: list[dict[str, Any]]
    thinking: list[str]
    show_thoughts: bool
    prompt_tokens: int
    image_tokens: int
    images: int = 0  # images generated per candidate (image models answer with one after their text)
    response_id: str = field(default_factory=lambda: random_id(22))

    def image_parts(self) -> list[dict[str, Any]]:
        return [{"inlineData": {"mimeType": "image/png", "data": PIXEL}}] * self.images

    def call_tokens(self) -> int:
        return sum(count_tokens(encode(c).decode()) + 4 for c in self.calls)

    def usage(self, candidates: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"promptTokenCount": self.prompt_tokens}
        if candidates:
            usage["candidatesTokenCount"] = candidates
        usage["totalTokenCount"] = self.prompt_tokens + candidates + len(self.thinking)
        details = [{"modality": "TEXT", "tokenCount": self.prompt_tokens - self.image_tokens}]
        if self.image_tokens:
            details.append({"modality": "IMAGE", "tokenCount": self.image_tokens})
        usage["promptTokensDetails"] = details
        if self.thinking:
            usage["thoughtsTokenCount"] = len(self.thinking)
        return usage

    def call_parts(self) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        for i, call in enumerate(self.calls):
            part: dict[str, Any] = {"functionCall": call}
            if i == 0 and self.thinking:
                part["thoughtSignature"] = SIGNATURE
            parts.append(part)
        return parts

    def steps(self, index: int) -> list[tuple[list[dict[str, Any]], int]]:
        """Candidate ``index`` as stream steps: (new parts, tokens they add)."""
        steps: list[tuple[list[dict[str, Any]], int]] = []
        if self.show_thoughts:
            steps += [([{"text": t, "thought": True}], 0) for t in self.thinking]
        steps += [([{"text": p}], 1) for p in self.candidates[index]]
        steps += [([part], IMAGE_OUT_TOKENS) for part in self.image_parts()]
        if self.calls:
            steps.append((self.call_parts(), self.call_tokens()))
        return steps or [([], 0)]

    def candidate(self, index: int, parts: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        content: dict[str, Any] = {"parts": parts, "role": "model"} if parts else {"role": "model"}
        out: dict[str, Any] = {"content": content}
        if finished:
            out["finishReason"] = self.finishes[index]
        out["index"] = index
        if finished and self.calls:
            out["finishMessage"] = "Model generated function call(s)."
        return out

    def envelope(self, candidates: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
        return {
            "candidates": candidates,
            "usageMetadata": self.usage(tokens),
            "modelVersion": self.model,
            "responseId": self.response_id,
        }

    def response(self) -> dict[str, Any]:
        candidates = []
        for index in range(len(self.candidates)):
            parts: list[dict[str, Any]] = []
            if self.show_thoughts and self.thinking:
                parts.append({"text": "".join(self.thinking), "thought": True})
            if self.candidates[index]:
                parts.append({"text": "".join(self.candidates[index])})
            parts += self.image_parts()
            parts += self.call_parts()
            candidates.append(self.candidate(index, parts, True))
        per_candidate = self.call_tokens() + self.images * IMAGE_OUT_TOKENS
        return self.envelope(
            candidates, sum(map(len, self.candidates)) + per_candidate * len(self.candidates)
        )

    def chunks(self) -> list[dict[str, Any]]:
        steps = [self.steps(i) for i in range(len(self.candidates))]
        tokens = 0
        out = []
        for k in range(max(map(len, steps))):
            candidates = []
            for index, seq in enumerate(steps):
                if k < len(seq):
                    parts, added = seq[k]
                    tokens += added
                    candidates.append(self.candidate(index, parts, k == len(seq) - 1))
            out.append(self.envelope(candidates, tokens))
        return out


class GeminiEmulator(Emulator):
    def __init__(self, api_key: str = "emu-key", rpm: int = 0) -> None:
        super().__init__(api_key, max_body=64 * 1024 * 1024, rpm=rpm)
        self.app.router.add_post(ROOT + "/models/{target}", self.post)
        # Vertex AI express mode (an API key, no project): google-genai calls Imagen only there now
        self.app.router.add_post("/v1beta1/publishers/google/models/{target}", self.post)
        self.app.router.add_get(ROOT + "/models", self.list_models)
        self.app.router.add_get(ROOT + "/models/{target}", self.get_model)

    def _denied(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if not key:
            return error(
                403,
                "Method doesn't allow unregistered callers (callers without established identity). "
                "Please use API Key or other form of API consumer identity to call this API.",
                "PERMISSION_DENIED",
            )
        if key != self.api_key:
            return error(
                400,
                "API key not valid. Please pass a valid API key.",
                "INVALID_ARGUMENT",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                        "metadata": {"service": "generativelanguage.googleapis.com"},
                    }
                ],
            )
        return None

    # -- models -----------------------------------------------------------------------------------
    @staticmethod
    def _card(name: str) -> dict[str, Any]:
        display, inp, out, thinks = MODELS[name]
        return {
            "name": f"models/{name}",
            "version": "001",
            "displayName": display,
            "description": display,
            "inputTokenLimit": inp,
            "outputTokenLimit": out,
            "supportedGenerationMethods": ["generateContent", "countTokens", "createCachedContent"],
            "temperature": 1,
            "topP": 0.95,
            "topK": 64,
            "maxTemperature": 2,
            "thinking": thinks,
        }

    async def list_models(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        size = int(request.query.get("pageSize") or 50)
        start = int(request.query.get("pageToken") or 0)
        names = list(MODELS)
        out: dict[str, Any] = {"models": [self._card(n) for n in names[start : start + size]]}
        if start + size < len(names):
            out["nextPageToken"] = str(start + size)
        return web.json_response(out)

    async def get_model(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        name = request.match_info["target"]
        if name not in MODELS:
            return error(404, f"models/{name} is not found for API version v1beta.", "NOT_FOUND")
        return web.json_response(self._card(name))

    # -- generate ---------------------------------------------------------------------------------
    def _validate(self, model: str, body: dict[str, Any]) -> str | None:
        for name in body:
            if name not in TOP_FIELDS and _camel_of(name) not in TOP_FIELDS:
                return f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
        config = get(body, "generationConfig") or {}
        for name in config:
            if name not in CONFIG_FIELDS and _camel_of(name) not in CONFIG_FIELDS:
                return (
                    f'Invalid JSON payload received. Unknown name "{name}" at '
                    "'generation_config': Cannot find field."
                )
        thinking = get(config, "thinkingConfig") or {}
        if get(thinking, "thinkingBudget") is not None and get(thinking, "thinkingLevel") is not None:
            return "You can only set only one of thinking budget and thinking level."
        contents = get(body, "contents")
        if not isinstance(contents, list) or not contents:
            return "* GenerateContentRequest.contents: contents is not specified\n"
        invalid = _invalid_contents(contents)
        if invalid is not None:
            return invalid
        if model.startswith("gemini-3"):
            return _missing_signature(contents)
        return None

    def _plan(self, model: str, body: dict[str, Any]) -> GeminiAnswer:
        contents = get(body, "contents")
        config = get(body, "generationConfig") or {}
        last = contents[-1]
        d = directives(" ".join(_texts(last)) if last.get("role", "user") == "user" else "")
        two = "[tool2]" in d.text
        d.text = d.text.replace("[tool2]", "").strip()
        system = get(body, "systemInstruction") or {}
        every = [p for c in [*contents, system] for p in get(c, "parts") or ()]
        prompt_tokens = sum(map(_tokens, every))
        image_tokens = IMAGE_TOKENS * sum(1 for p in every if get(p, "inlineData") or get(p, "fileData"))
        responses = [fr for p in get(last, "parts") or () if (fr := get(p, "functionResponse"))]
        if responses:
            d.echo, d.text = True, _tool_result(responses)
        calls = [] if responses else self._calls(body, d, two)
        thinking_config = get(config, "thinkingConfig") or {}
        show = bool(d.think or get(thinking_config, "includeThoughts"))
        thinking = THOUGHT if show or model.startswith("gemini-3") else []
        cap = get(config, "maxOutputTokens")
        visible = max(0, cap - len(thinking)) if isinstance(cap, int) else None
        stops = get(config, "stopSequences") or []
        prompt = " ".join(t for c in contents for t in _texts(c))
        candidates, finishes = [], []
        json_schema = _json_schema(config)
        for n in range(int(get(config, "candidateCount") or 1)):
            if json_schema is not None and not d.echo:  # JSON mode: an answer that follows the schema
                pieces, truncated = structured_pieces(json_schema or None, visible, n)
            else:
                pieces, truncated = reply_pieces(prompt + (f"#{n}" if n else ""), d, visible)
            pieces, stopped = _apply_stops(pieces, stops)
            if calls:
                pieces, truncated = [], False
            candidates.append(pieces)
            finishes.append("MAX_TOKENS" if truncated and not stopped else "STOP")
        images = 1 if "image" in model and not calls else 0  # the image models draw what they are asked
        return GeminiAnswer(
            model, d, candidates, finishes, calls, thinking, show, prompt_tokens, image_tokens, images
        )

    @staticmethod
    def _calls(body: dict[str, Any], d: Directives, two: bool) -> list[dict[str, Any]]:
        declarations = [f for t in get(body, "tools") or () for f in get(t, "functionDeclarations") or ()]
        calling = get(get(body, "toolConfig") or {}, "functionCallingConfig") or {}
        mode = str(get(calling, "mode") or "AUTO").upper()
        if not declarations or mode == "NONE" or not (d.tool or two or mode == "ANY"):
            return []
        allowed = get(calling, "allowedFunctionNames") or []
        pool = [f for f in declarations if not allowed or f.get("name") in allowed] or declarations
        first = d.tool_index([f.get("name") for f in pool])
        chosen = pool[:2] if two and len(pool) > 1 else pool[first : first + 1]
        return [
            {"name": f.get("name", "tool"), "args": d.arguments(f.get("name", "tool"), _schema(f))}
            for f in chosen
        ]

    async def post(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["target"].partition(":")
        if method not in ("generateContent", "streamGenerateContent", "countTokens", *MEDIA_METHODS):
            return error(404, f"Method {method or 'none'} is not found for models/{model}.", "NOT_FOUND")
        denied = self._denied(request)
        if denied is not None:
            return denied
        try:
            body = decode(await request.read())
        except msgspec.DecodeError as exc:
            return error(400, f"Invalid JSON payload received. {exc}", "INVALID_ARGUMENT")
        if not isinstance(body, dict):
            return error(400, "Invalid JSON payload received. Expected an object.", "INVALID_ARGUMENT")
        self.received(body)
        if method != "countTokens" and (wait := self.over_limit()) is not None:
            return fault(429, f"{retry_after(wait)}s")  # Gemini says when in RetryInfo, not in Retry-After
        if method == "predict":
            return await imagen_predict(model, body, fault)
        if method in MEDIA_METHODS:
            return await gemini_embed(model, method, body, fault)
        if method == "countTokens" and isinstance(get(body, "generateContentRequest"), dict):
            body = get(body, "generateContentRequest")
        if model not in MODELS and not _MODEL_NAME.fullmatch(model):
            return error(
                404,
                f"models/{model} is not found for API version v1beta, or is not supported for "
                f"{method}. Call ListModels to see the list of available models and their supported "
                "methods.",
                "NOT_FOUND",
            )
        invalid = self._validate(model, body)
        if invalid is not None:
            return error(400, invalid, "INVALID_ARGUMENT")
        plan = self._plan(model, body)
        if method == "countTokens":
            return web.json_response(
                {
                    "totalTokens": plan.prompt_tokens,
                    "promptTokensDetails": plan.usage(0)["promptTokensDetails"],
                }
            )
        await pause(plan.d.slow_ms)
        if plan.d.fault:
            return fault(plan.d.fault)
        if method == "streamGenerateContent":
            return await self._stream(request, plan, request.query.get("alt") == "sse")
        if plan.d.malformed:
            return web.Response(
                body=b'{"candidates": [{"content": {"parts": [{"text": "br', content_type="application/json"
            )
        return web.Response(body=encode(plan.response()), content_type="application/json")

    async def _stream(self, request: web.Request, plan: GeminiAnswer, sse: bool) -> web.StreamResponse:
        ctype = "text/event-stream" if sse else "application/json"
        response = web.StreamResponse(headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
        await response.prepare(request)
        d = plan.d
        events = [encode(chunk) for chunk in plan.chunks()]
        if d.malformed and len(events) > 1:
            events[1] = b'{"candidates": [{"content": {"parts": [{"te'
        if sse:
            frames = [b"data: " + data + b"\r\n\r\n" for data in events]
        else:
            frames = [
                (b"[" if i == 0 else b",\r\n") + data + (b"]" if i == len(events) - 1 else b"")
                for i, data in enumerate(events)
            ]
        fail = (
            (1, b"data: " + MIDFAIL + b"\r\n\r\n" if sse else b",\r\n" + MIDFAIL + b"]")
            if d.midfail
            else None
        )
        await play(request, response, frames, d, d.cut, fail)
        return response


def _camel_of(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _invalid_contents(contents: list[Any]) -> str | None:
    for i, content in enumerate(contents):
        where = f"* GenerateContentRequest.contents[{i}]"
        if not isinstance(content, dict):
            return f"{where}: must be an object\n"
        if content.get("role", "user") not in ROLES:
            return "Please use a valid role: user, model."
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"{where}.parts: contents.parts must not be empty.\n"
        for j, part in enumerate(parts):
            if sum(get(part, k) is not None for k in PART_DATA) != 1:
                return (
                    f"{where}.parts[{j}].data: required oneof field 'data' must have one initialized field\n"
                )
            if get(part, "text") == "":
                return (
                    "Unable to submit request because it has an empty text parameter. "
                    "Add a value to the parameter and try again."
                )
            response = get(part, "functionResponse")
            if response is not None and not isinstance(get(response, "response"), dict):
                return f"{where}.parts[{j}].function_response.response: must be an object\n"
    return None


def _missing_signature(contents: list[dict[str, Any]]) -> str | None:
    """Gemini 3: in the current turn (after the last user text), the first function call of each model
    step must carry its ``thoughtSignature``."""
    start = max(
        (i for i, c in enumerate(contents) if c.get("role", "user") == "user" and _texts(c)), default=0
    )
    for i in range(start + 1, len(contents)):
        calls = [p for p in contents[i].get("parts") or () if get(p, "functionCall")]
        if contents[i].get("role") == "model" and calls and not get(calls[0], "thoughtSignature"):
            name = get(calls[0], "functionCall").get("name")
            return (
                "Function call is missing a thought_signature in functionCall parts. This is required "
                "for tools to work correctly, and missing thought_signature may lead to degraded model "
                "performance. "
                f"Additional data, function call `default_api:{name}` , position {i + 1}. Please refer to "
                "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
            )
    return None
