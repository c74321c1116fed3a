"""``GET /openapi.json``: the gateway's own HTTP surface as an OpenAPI 3.1 document.

Bodies and answers that are msgspec structs (the chat request, models, files, batches) get their JSON
Schema from the structs themselves (``msgspec.json.schema_components``), so the document cannot
drift from what the code accepts; the rest (the Responses request, the admin API's small bodies, the
error body) is written here. Every route the app serves under ``/v1``, ``/console/api`` and the
probes is an :class:`Op` below, and ``tests/test_openapi.py`` checks that none is missing, then runs
schemathesis against the document: no input may get a 5xx, every error is OpenAI-shaped.

To document a new endpoint, add its :class:`Op` to ``OPERATIONS`` (the test fails until you do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from core.wire import ChatRequest, ModelCard, ModelList
from router.batches import BatchObject, CreateBatch
from router.files import FileDeleted, FileObject, ListPage
from router.stored_responses import Deleted, ItemPage

Auth = Literal["key", "admin", "none"]

ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
OBJECT: dict[str, Any] = {"type": "object"}
CREDITS: dict[str, Any] = {"type": ["string", "number"], "description": "credits, up to 9 decimals"}
RESPONSES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "description": "OpenAI's Responses request; fields not listed pass through (native) or are refused by name.",
    "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": ["string", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        "text": {"type": "object"},
        "reasoning": {"type": "object"},
        "store": {"type": ["boolean", "null"]},
        "previous_response_id": {"type": ["string", "null"]},
        "background": {"type": ["boolean", "null"]},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "user": {"type": "string"},
    },
}
_BLOCKS: dict[str, Any] = {
    "type": "array",
    "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
}
MESSAGES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "description": "Anthropic's Messages request: passed through for anthropic/... models, translated for the others.",
    "properties": {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"type": "string", "enum": ["user", "assistant", "system"]},
                    "content": {"oneOf": [{"type": "string"}, _BLOCKS]},
                },
            },
        },
        "system": {"oneOf": [{"type": "string"}, _BLOCKS]},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"type": "object"},
        "thinking": {"type": "object"},
        "metadata": {"type": "object", "properties": {"user_id": {"type": ["string", "null"]}}},
        "output_config": {"type": "object"},
    },
}
COUNT_TOKENS_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        name: MESSAGES_REQUEST["properties"][name]
        for name in ("model", "messages", "system", "tools", "tool_choice", "thinking")
    },
}
EMBEDDINGS_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string"},
        "input": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                },
            ]
        },
        "dimensions": {"type": "integer", "minimum": 1},
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "user": {"type": "string"},
        "task_type": {"type": "string"},
    },
}
_IMAGE_FIELDS: dict[str, Any] = {
    "model": {"type": "string"},
    "prompt": {"type": "string", "minLength": 1, "maxLength": 32000},
    "n": {"type": "integer", "minimum": 1, "maximum": 10},
    "size": {"type": "string"},
    "quality": {"type": "string", "enum": ["auto", "low", "medium", "high"]},
    "response_format": {"type": "string", "enum": ["b64_json"]},
    "user": {"type": "string"},
}
IMAGES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": _IMAGE_FIELDS,
}
IMAGES_EDIT: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt", "image"],
    "properties": {
        **_IMAGE_FIELDS,
        "image": {"type": "string", "format": "binary"},
        "mask": {"type": "string", "format": "binary"},
    },
}
GROUP_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "credits"],
    "properties": {"name": {"type": "string"}, "credits": CREDITS},
}
TOPUP: dict[str, Any] = {"type": "object", "required": ["credits"], "properties": {"credits": CREDITS}}
# a key's lifecycle fields: an expiry (epoch seconds, ISO 8601, or a duration from now: "30d"), tags, owner
KEY_META: dict[str, Any] = {
    "expires_at": {"oneOf": [{"type": "number"}, {"type": "string"}, {"type": "null"}]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "owner": {"type": "string"},
}
KEY_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "spend_cap": {"oneOf": [CREDITS, {"type": "null"}]},
        "allowed_models": {"type": ["array", "null"], "items": {"type": "string"}},
        **KEY_META,
    },
}
BUDGET_AMOUNT: dict[str, Any] = {"type": "object", "required": ["amount"], "properties": {"amount": CREDITS}}
BUDGET_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["amount", "window"],
    "properties": {
        "amount": CREDITS,
        "window": {"type": "string", "description": "day, week, month (calendar) or a rolling 30m, 12h, 7d"},
        "key_id": {"type": ["integer", "null"], "minimum": 1},
        "timezone": {"type": "string", "description": "an IANA zone for a calendar window"},
    },
}
KEY_UPDATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spend_cap": {"oneOf": [CREDITS, {"type": "null"}]},
        "allowed_models": {"type": ["array", "null"], "items": {"type": "string"}},
        **KEY_META,
    },
}
WEBHOOK_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["url"],
    "properties": {
        "url": {
            "type": "string",
            "format": "uri",
            "description": "http(s); a public address, unless [alerts] allow_destinations lists it",
        },
        "group": {"type": ["string", "null"]},
        "balance_below": {"oneOf": [CREDITS, {"type": "null"}]},
        "expiry_within": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}, {"type": "null"}]},
        "budgets": {"type": "boolean"},
    },
}
KEY_ROTATE: dict[str, Any] = {
    "type": "object",
    "properties": {"grace_seconds": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}]}},
}
UPLOAD: dict[str, Any] = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch"]},
    },
}


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["path", "query"] = "query"
    schema: Any = None  # default: a string

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "in": self.where,
            "required": self.where == "path",
            "schema": self.schema or {"type": "string"},
        }


INT = {"type": "integer", "minimum": 0}
PAGE = (
    Param("after"),
    Param("limit", schema={"type": "integer", "minimum": 1, "maximum": 10_000}),
    Param("order", schema={"type": "string", "enum": ["asc", "desc"]}),
)
USAGE = (
    Param("source", schema={"type": "string", "enum": ["api", "job"]}),
    Param("model"),
    Param("key"),
    Param("since", schema=INT),
    Param("until", schema=INT),
)


@dataclass(frozen=True)
class Op:
    """One operation: a method on a path, what it takes and what it answers."""

    method: str
    path: str
    summary: str
    tag: str
    auth: Auth = "key"
    params: tuple[Param, ...] = ()
    body: Any = None  # a msgspec type or a JSON Schema
    body_type: str = "application/json"
    answer: Any = None  # a msgspec type or a JSON Schema; None: a JSON object
    answer_type: str = "application/json"
    dialect: Literal["openai", "anthropic"] = "openai"  # the shape of its errors


def _path(*names: str) -> tuple[Param, ...]:
    return tuple(Param(name, "path") for name in names)


OPERATIONS: tuple[Op, ...] = (
    Op(
        "post",
        "/v1/chat/completions",
        "Create a chat completion (stream: true answers text/event-stream)",
        "model calls",
        body=ChatRequest,
    ),
    Op(
        "post",
        "/v1/responses",
        "Create a response (stream: true answers text/event-stream)",
        "model calls",
        body=RESPONSES_REQUEST,
    ),
    Op(
        "post",
        "/v1/messages",
        "Create a message, Anthropic's Messages API (stream: true answers text/event-stream)",
        "model calls",
        body=MESSAGES_REQUEST,
        dialect="anthropic",
    ),
    Op(
        "post",
        "/v1/messages/count_tokens",
        "Count a message's input tokens (never billed)",
        "model calls",
        body=COUNT_TOKENS_REQUEST,
        answer={
            "type": "object",
            "required": ["input_tokens"],
            "properties": {"input_tokens": {"type": "integer"}},
        },
        dialect="anthropic",
    ),
    Op("post", "/v1/embeddings", "Create embeddings", "model calls", body=EMBEDDINGS_REQUEST),
    Op("post", "/v1/images/generations", "Generate images (b64_json)", "model calls", body=IMAGES_REQUEST),
    Op(
        "post",
        "/v1/images/edits",
        "Edit images (b64_json)",
        "model calls",
        body=IMAGES_EDIT,
        body_type="multipart/form-data",
    ),
    Op(
        "get",
        "/v1/responses/{response_id}",
        "Retrieve a stored response (a background one: its status now)",
        "model calls",
        params=_path("response_id"),
    ),
    Op(
        "delete",
        "/v1/responses/{response_id}",
        "Delete a stored response",
        "model calls",
        params=_path("response_id"),
        answer=Deleted,
    ),
    Op(
        "get",
        "/v1/responses/{response_id}/input_items",
        "A stored response's input items",
        "model calls",
        params=(
            *_path("response_id"),
            Param("after"),
            Param("before"),
            Param("limit", schema={"type": "integer", "minimum": 1, "maximum": 100}),
            Param("order", schema={"type": "string", "enum": ["asc", "desc"]}),
        ),
        answer=ItemPage,
    ),
    Op(
        "post",
        "/v1/responses/{response_id}/cancel",
        "Cancel a queued or running background response",
        "model calls",
        params=_path("response_id"),
    ),
    Op("get", "/v1/models", "List the models the key may call", "models", answer=ModelList),
    Op("get", "/v1/models/{model}", "Retrieve a model", "models", params=_path("model"), answer=ModelCard),
    Op(
        "post",
        "/v1/files",
        "Upload a batch input file",
        "batches",
        body=UPLOAD,
        body_type="multipart/form-data",
        answer=FileObject,
    ),
    Op(
        "get",
        "/v1/files",
        "List the group's files",
        "batches",
        params=(*PAGE, Param("purpose")),
        answer=ListPage[FileObject],
    ),
    Op(
        "get", "/v1/files/{file_id}", "Retrieve a file", "batches", params=_path("file_id"), answer=FileObject
    ),
    Op(
        "delete",
        "/v1/files/{file_id}",
        "Delete a file",
        "batches",
        params=_path("file_id"),
        answer=FileDeleted,
    ),
    Op(
        "get",
        "/v1/files/{file_id}/content",
        "A file's content (JSON lines)",
        "batches",
        params=_path("file_id"),
        answer={"type": "string"},
        answer_type="application/jsonl",
    ),
    Op("post", "/v1/batches", "Create a batch", "batches", body=CreateBatch, answer=BatchObject),
    Op(
        "get", "/v1/batches", "List the group's batches", "batches", params=PAGE, answer=ListPage[BatchObject]
    ),
    Op(
        "get",
        "/v1/batches/{batch_id}",
        "Retrieve a batch",
        "batches",
        params=_path("batch_id"),
        answer=BatchObject,
    ),
    Op(
        "post",
        "/v1/batches/{batch_id}/cancel",
        "Cancel a batch",
        "batches",
        params=_path("batch_id"),
        answer=BatchObject,
    ),
    Op("get", "/healthz", "Liveness", "operations", auth="none"),
    Op("get", "/readyz", "Readiness: the store and every deployment's address", "operations", auth="none"),
    Op(
        "get",
        "/metrics",
        "Prometheus metrics",
        "operations",
        auth="none",
        answer={"type": "string"},
        answer_type="text/plain",
    ),
    Op("get", "/openapi.json", "This document", "operations", auth="none"),
    Op(
        "post",
        "/console/api/reload",
        "Read the configuration file again and apply it to new calls (audited)",
        "admin",
        auth="admin",
    ),
    Op("get", "/console/api/groups", "Groups", "admin", auth="admin"),
    Op("post", "/console/api/groups", "Create a group", "admin", auth="admin", body=GROUP_CREATE),
    Op("get", "/console/api/groups/{name}", "A group", "admin", auth="admin", params=_path("name")),
    Op(
        "post",
        "/console/api/groups/{name}/topup",
        "Top a group up",
        "admin",
        auth="admin",
        params=_path("name"),
        body=TOPUP,
    ),
    Op(
        "get",
        "/console/api/groups/{name}/keys",
        "A group's keys",
        "admin",
        auth="admin",
        params=_path("name"),
    ),
    Op(
        "post",
        "/console/api/groups/{name}/keys",
        "Create a key (its secret is in this answer only)",
        "admin",
        auth="admin",
        params=_path("name"),
        body=KEY_CREATE,
    ),
    Op(
        "get",
        "/console/api/groups/{name}/usage",
        "A group's usage records, newest first",
        "admin",
        auth="admin",
        params=(
            *_path("name"),
            *USAGE,
            Param("before", schema=INT),
            Param("limit", schema=INT),
            Param("deployment"),
        ),
    ),
    Op(
        "get",
        "/console/api/groups/{name}/usage/buckets",
        "A group's usage per time bucket",
        "admin",
        auth="admin",
        params=(
            *_path("name"),
            *USAGE,
            Param("width", schema={"type": "number", "minimum": 60, "maximum": 1e11}),
        ),
    ),
    Op("get", "/console/api/keys/{key_id}", "A key", "admin", auth="admin", params=_path("key_id")),
    Op(
        "patch",
        "/console/api/keys/{key_id}",
        "Change a key's spend cap, models, expiry, tags or owner",
        "admin",
        auth="admin",
        params=_path("key_id"),
        body=KEY_UPDATE,
    ),
    Op(
        "post",
        "/console/api/keys/{key_id}/rotate",
        "A new secret for a key (in this answer only); the old one works for grace_seconds more",
        "admin",
        auth="admin",
        params=_path("key_id"),
        body=KEY_ROTATE,
    ),
    Op(
        "post",
        "/console/api/keys/{key_id}/revoke",
        "Revoke a key",
        "admin",
        auth="admin",
        params=_path("key_id"),
    ),
    Op(
        "get",
        "/console/api/keys/{key_id}/usage",
        "A key's usage per model",
        "admin",
        auth="admin",
        params=(*_path("key_id"), Param("since", schema=INT), Param("until", schema=INT)),
    ),
    Op("get", "/console/api/webhooks", "Webhooks (never their secrets)", "admin", auth="admin"),
    Op(
        "post",
        "/console/api/webhooks",
        "Add a webhook (its signing secret is in this answer only)",
        "admin",
        auth="admin",
        body=WEBHOOK_CREATE,
    ),
    Op(
        "delete",
        "/console/api/webhooks/{webhook_id}",
        "Remove a webhook",
        "admin",
        auth="admin",
        params=_path("webhook_id"),
    ),
    Op(
        "get",
        "/console/api/webhooks/{webhook_id}/deliveries",
        "A webhook's events and their delivery status",
        "admin",
        auth="admin",
        params=(*_path("webhook_id"), Param("limit", schema=INT)),
    ),
    Op(
        "get",
        "/console/api/audit",
        "The audit log, newest first",
        "admin",
        auth="admin",
        params=(Param("target"), Param("action"), Param("before", schema=INT), Param("limit", schema=INT)),
    ),
    Op(
        "get",
        "/console/api/groups/{name}/budgets",
        "A group's and its keys' budgets, with their windows now",
        "admin",
        auth="admin",
        params=_path("name"),
    ),
    Op(
        "post",
        "/console/api/groups/{name}/budgets",
        "Add a budget to a group or one of its keys",
        "admin",
        auth="admin",
        params=_path("name"),
        body=BUDGET_CREATE,
    ),
    Op(
        "patch",
        "/console/api/budgets/{budget_id}",
        "A budget's new amount (its window and spend stay)",
        "admin",
        auth="admin",
        params=_path("budget_id"),
        body=BUDGET_AMOUNT,
    ),
    Op(
        "delete",
        "/console/api/budgets/{budget_id}",
        "Remove a budget",
        "admin",
        auth="admin",
        params=_path("budget_id"),
    ),
    Op(
        "get",
        "/console/api/groups/{name}/users",
        "A group's usage per end user, most credits first",
        "admin",
        auth="admin",
        params=(
            *_path("name"),
            Param("key", schema=INT),
            Param("since", schema=INT),
            Param("until", schema=INT),
            Param("limit", schema=INT),
        ),
    ),
)


def _struct_types(ops: tuple[Op, ...]) -> list[Any]:
    types = [t for op in ops for t in (op.body, op.answer) if t is not None and not isinstance(t, dict)]
    return list({id(t): t for t in types}.values())


def document(ops: tuple[Op, ...] = OPERATIONS, title: str = "Model router") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ops``."""
    types = _struct_types(ops)
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    schema_of = dict(zip(map(id, types), refs, strict=True))

    def schema(value: Any) -> Any:
        if value is None:
            return OBJECT
        return value if isinstance(value, dict) else schema_of[id(value)]

    errors = {
        "openai": {
            "description": "An OpenAI-shaped error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        },
        "anthropic": {
            "description": "An Anthropic-shaped error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AnthropicError"}}},
        },
    }
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        error = errors[op.dialect]
        operation: dict[str, Any] = {
            "summary": op.summary,
            "tags": [op.tag],
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
            "responses": {
                "200": {"description": "OK", "content": {op.answer_type: {"schema": schema(op.answer)}}},
                "4XX": error,
                "5XX": error,
            },
        }
        if op.params:
            operation["parameters"] = [p.spec() for p in op.params]
        if op.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {op.body_type: {"schema": schema(op.body)}},
            }
        if op.auth != "none":
            operation["security"] = [{"apiKey" if op.auth == "key" else "adminToken": []}]
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": "1",
            "description": "An OpenAI-compatible gateway to several providers.",
        },
        "paths": paths,
        "components": {
            "schemas": {**components, "Error": ERROR, "AnthropicError": ANTHROPIC_ERROR},
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a key of a group (sk-mr-v1-...); on /v1/messages also in x-api-key",
                },
                "adminToken": {"type": "http", "scheme": "bearer", "description": "[console] admin_token"},
            },
        },
    }


_encoded: bytes | None = None


def encoded() -> bytes:
    """The document as JSON, built once."""
    global _encoded
    if _encoded is None:
        _encoded = msgspec.json.encode(document())
    return _encoded
