"""The OpenAI Chat Completions protocol, shared by p1 (OpenAI), p4 (Upstage) and p5 (Mistral).

Provider differences are data in the catalog's ``[providers.X]`` table, not code: fields to drop or
rename, whether the upstream must be asked for stream usage, the finish reasons to map, the name of
the reasoning field. Reasoning text always comes out as ``reasoning_content`` (message and delta),
never mixed into ``content``.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any
from urllib.parse import quote

import msgspec

from adapters.base import (
    REASONING,
    USER_AGENT,
    Adapter,
    Call,
    StreamTranslator,
    UpstreamRequest,
    UpstreamStreamError,
    stream_object,
)
from core.deployments import Deployment
from core.errors import UpstreamError
from core.kept import as_sent
from core.sse import Event
from core.wire import TokenUsage, usage_from_openai, with_details

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _split_content(content: list[Any]) -> tuple[str, str]:
    """Mistral reasoning output: content is a list of ``thinking`` and ``text`` chunks."""
    text: list[str] = []
    thinking: list[str] = []
    for chunk in content:
        if not isinstance(chunk, dict):
            continue
        if chunk.get("type") == "text":
            text.append(chunk.get("text") or "")
        elif chunk.get("type") == "thinking":
            for inner in chunk.get("thinking") or []:
                if isinstance(inner, dict):
                    thinking.append(inner.get("text") or "")
    return "".join(text), "".join(thinking)


_ALNUM = string.ascii_letters + string.digits


def alnum9(value: str) -> str:
    """A tool call id as 9 of ``[a-zA-Z0-9]`` (Mistral refuses any other): kept if it is one, else
    derived from its hash, so every turn of a conversation maps an id the same way, with no state."""
    if len(value) == 9 and value.isascii() and value.isalnum():
        return value
    number = int.from_bytes(hashlib.sha256(value.encode()).digest()[:8])
    out = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        out.append(_ALNUM[digit])
    return "".join(out)


def alnum9_ids(messages: list[Any]) -> list[Any]:
    """``messages`` with every tool call id (assistant ``tool_calls``, ``tool`` messages) as :func:`alnum9`."""
    return [_alnum9_message(m) if isinstance(m, dict) else m for m in messages]


def _alnum9_message(message: dict[str, Any]) -> dict[str, Any]:
    out = message
    if isinstance(tid := message.get("tool_call_id"), str) and (fixed := alnum9(tid)) != tid:
        out = {**out, "tool_call_id": fixed}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        renamed = [_alnum9_call(c) for c in calls]
        if any(new is not old for new, old in zip(renamed, calls, strict=True)):
            out = {**out, "tool_calls": renamed}
    return out


def _alnum9_call(call: Any) -> Any:
    cid = call.get("id") if isinstance(call, dict) else None
    return {**call, "id": fixed} if isinstance(cid, str) and (fixed := alnum9(cid)) != cid else call


def address(deployment: Deployment, path: str, name: str) -> tuple[str, dict[str, str]]:
    """Where ``path`` (``chat/completions``, ``embeddings``, ``images/generations``, ...) of an OpenAI-protocol
    deployment is, and the header its key goes in: Azure OpenAI puts the deployment (``name``) in the path
    and the key in ``api-key`` (docs/providers.md, "Azure OpenAI"); the others, ``{base_url}/{path}`` and a
    bearer token."""
    if deployment.kind == "azure":
        return (
            f"{deployment.base_url}/openai/deployments/{quote(name, safe='')}/{path}"
            f"?api-version={quote(deployment.api_version, safe='')}"
        ), {"api-key": deployment.api_key}
    return f"{deployment.base_url}/{path}", {"Authorization": f"Bearer {deployment.api_key}"}


class OpenAIAdapter(Adapter):
    protocol = "openai"

    def build_request(self, call: Call) -> UpstreamRequest:
        spec = self.spec
        body = dict(call.raw)
        target = call.deployment
        body["model"] = name = call.upstream_model
        if call.model.reasoning and spec.reasoning_cap_field and "max_tokens" in body:
            cap = body.pop("max_tokens")
            body.setdefault(spec.reasoning_cap_field, cap)
        for old, new in spec.rename_fields.items():
            if old in body:
                value = body.pop(old)
                body.setdefault(new, value)
        if call.stream:
            body["stream"] = True
            if spec.stream_usage == "ask":
                options = dict(body.get("stream_options") or {})
                options["include_usage"] = True
                body["stream_options"] = options
        for field in spec.drop_fields:
            body.pop(field, None)
        if call.model.reasoning:
            for field in spec.reasoning_drop_fields:
                body.pop(field, None)
        if "tools" in body:
            body["tools"] = as_sent(body["tools"])  # (a kept set: encoded once for the set)
        if spec.tool_call_ids == "alnum9" and isinstance(body.get("messages"), list):
            body["messages"] = alnum9_ids(body["messages"])
        url, headers = address(target, "chat/completions", name)
        headers |= {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if call.stream:
            headers["Accept"] = "text/event-stream"
        return UpstreamRequest(url, headers, _encode(body))

    def _finish(self, reason: Any) -> Any:
        if reason == "error":
            raise UpstreamStreamError(f"The provider '{self.name}' ended the answer with an error.")
        return self.spec.finish_reasons.get(reason, reason) if isinstance(reason, str) else reason

    def _normalise(self, part: dict[str, Any]) -> None:
        """Move provider-specific reasoning into ``reasoning_content`` (a message or a delta)."""
        field = self.spec.reasoning_field
        if field and field in part:
            part[REASONING] = part.pop(field)
        content = part.get("content")
        if isinstance(content, list):
            text, thinking = _split_content(content)
            part["content"] = text
            if thinking:
                part[REASONING] = part.get(REASONING, "") + thinking

    def parse_response(self, call: Call, body: bytes) -> tuple[dict[str, Any], TokenUsage | None]:
        try:
            data = _decode(body)
        except msgspec.DecodeError:
            raise UpstreamError(f"The provider '{self.name}' returned a body that is not JSON.") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError(f"The provider '{self.name}' returned an unexpected answer shape.")
        for choice in data["choices"]:
            if isinstance(choice, dict):
                choice["finish_reason"] = self._finish(choice.get("finish_reason"))
                message = choice.get("message")
                if isinstance(message, dict):
                    self._normalise(message)
                    _typed_calls(message.get("tool_calls"))
        usage = usage_from_openai(data.get("usage"))
        if usage is not None:
            data["usage"] = with_details(data["usage"], usage)
        return data, usage

    def plain_answer(self, call: Call, body: bytes) -> tuple[dict[str, msgspec.Raw], TokenUsage] | None:
        """The common answer (every choice a text message ended other than by ``error``, no tool calls, a
        non-empty usage object without ``cost``) of a provider with nothing to rename or map:
        :meth:`parse_response` would change nothing in it, so its fields stay bytes (``usage`` is
        decoded too, to be read as parse_response reads it)."""
        spec = self.spec
        if spec.reasoning_field or spec.finish_reasons:
            return None
        try:
            top = _decode_top(body)
            choices = _decode_choices(top["choices"])
            usage = _decode(top["usage"])
        except (msgspec.DecodeError, KeyError):  # (ValidationError is a DecodeError)
            return None
        if not isinstance(usage, dict) or not usage or "cost" in usage:
            return None
        for choice in choices:
            message = choice.message
            if choice.finish_reason == "error" or message is None or message.tool_calls is not None:
                return None
        normal = usage_from_openai(usage)
        assert normal is not None  # (a dict: never None)
        full = with_details(usage, normal)
        if full is not usage:  # (Mistral's: its details objects added, as parse_response adds them)
            top["usage"] = msgspec.Raw(_encode(full))
        return top, normal

    def stream(self, call: Call) -> StreamTranslator:
        return _OpenAIStream(self)


class _Message(msgspec.Struct):
    content: str | None = None  # (a list of parts is normalised: the long way)
    tool_calls: msgspec.Raw | None = None


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    message: _Message | None = None


_decode_top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_choices = msgspec.json.Decoder(list[_Choice]).decode


def _typed_calls(calls: Any) -> None:
    """A message's tool calls as OpenAI writes them: with their ``type``, without a stream's ``index``.
    Mistral answers ``{"function": {...}, "id": "FI5qQGzDE", "index": 0}`` (client-python's ToolCall has
    ``type`` optional and an ``index``), which ``ChatCompletion`` refuses and which code testing
    ``tool_call.type == "function"`` would skip."""
    for tool_call in calls if isinstance(calls, list) else ():
        if isinstance(tool_call, dict):
            tool_call.pop("index", None)
            if "type" not in tool_call or tool_call["type"] is None:
                tool_call["type"] = "custom" if "custom" in tool_call else "function"


class _OpenAIStream(StreamTranslator):
    def __init__(self, adapter: OpenAIAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        # nothing in a plain text chunk to rename or map (see _normalise, _finish)
        self.passthrough = not adapter.spec.reasoning_field and not adapter.spec.finish_reasons

    def feed(self, event: Event) -> list[dict[str, Any]]:
        data = event.data
        if data == b"[DONE]":
            self.finished = True
            return []
        chunk = stream_object(data, self.adapter.name)
        if "error" in chunk or chunk.get("object") == "error":
            err = chunk.get("error")
            message = err.get("message") if isinstance(err, dict) else chunk.get("message")
            raise UpstreamStreamError(
                f"The provider '{self.adapter.name}' failed mid-stream: {message or 'unknown error'}"
            )
        usage = chunk.get("usage")
        if usage:
            self.usage = usage_from_openai(usage)
            self.usage_raw = (
                with_details(usage, self.usage) if isinstance(usage, dict) and self.usage else usage
            )
        elif not chunk.get("choices"):
            return []  # no choice and no usage: an annotation (Azure's prompt_filter_results frame)
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                if choice.get("finish_reason") is not None:
                    choice["finish_reason"] = self.adapter._finish(choice["finish_reason"])
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    self.adapter._normalise(delta)
                    # a call's first delta (it has the id) says its type
                    for call in delta.get("tool_calls") or ():
                        if isinstance(call, dict) and call.get("id") and not call.get("type"):
                            call["type"] = "custom" if "custom" in call else "function"
        return [chunk]
