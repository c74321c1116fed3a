"""A value that satisfies a JSON Schema: what the emulators answer for structured output and tool
arguments, as a real model constrained by the schema would (every required property, the right types,
enums, nested objects and arrays, ``$ref`` / ``$defs``, ``anyOf`` / ``oneOf`` / ``allOf``).

Gemini's own schema dialect (``responseSchema``: OpenAPI 3.0 with upper-case type names such as
``OBJECT``) is read the same way, type names folded to lower case.
"""

from __future__ import annotations

from typing import Any

WORDS = ("Seoul", "router", "answer", "gateway", "blue", "seven", "river", "quiet")
MAX_DEPTH = 12  # a recursive schema ($ref to itself) stops here with the smallest value


def instance(schema: Any, root: Any = None, depth: int = 0, name: str = "", variant: int = 0) -> Any:
    """A value of ``schema`` (``root``: the document its ``$ref`` s point into); another ``variant``
    gives other strings (several candidates of one request differ, as a model's do)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None if depth > MAX_DEPTH else f"{name or 'value'} {WORDS[depth % len(WORDS)]}"
    if "$ref" in schema:
        return instance(_resolve(root, str(schema["$ref"])), root, depth + 1, name, variant)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next(
                (o for o in options if not (isinstance(o, dict) and _kind(o) == "null")), options[0]
            )
            return instance(chosen, root, depth + 1, name, variant)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                part = _resolve(root, str(part["$ref"])) if "$ref" in part else part
                merged = _merge(merged, part)
        return instance(merged, root, depth + 1, name, variant)
    kind = _kind(schema)
    if kind == "object" or (kind is None and "properties" in schema):
        return _object(schema, root, depth, variant)
    if kind == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        count = max(int(schema.get("minItems") or 0), 1)
        return [instance(items, root, depth + 1, name, variant) for _ in range(count)]
    if kind == "integer":
        return _number(schema, 3, int)
    if kind == "number":
        return _number(schema, 1.5, float)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema, variant)


def _kind(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the non-null one
        kind = next((k for k in kind if str(k).lower() != "null"), "null")
    return str(kind).lower() if kind is not None else None


def _object(schema: dict[str, Any], root: Any, depth: int, variant: int) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, dict):  # an object of any shape (JSON mode): a small one, never empty
        return {"answer": " ".join(WORDS[(variant + i) % len(WORDS)] for i in range(3))}
    return {key: instance(prop, root, depth + 1, key, variant) for key, prop in props.items()}


def _number(schema: dict[str, Any], default: float, kind: type) -> Any:
    low, high = schema.get("minimum"), schema.get("maximum")
    value: float = default
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    if isinstance(schema.get("exclusiveMinimum"), int | float) and value <= schema["exclusiveMinimum"]:
        value = schema["exclusiveMinimum"] + 1
    return kind(value)


def _string(schema: dict[str, Any], variant: int) -> str:
    fmt = schema.get("format")
    if fmt == "date-time":
        return "2026-11-24T09:00:00Z"
    if fmt == "date":
        return "2026-11-24"
    if fmt == "email":
        return "someone@example.com"
    if fmt in ("uri", "url"):
        return "https://example.com/"
    if fmt == "uuid":
        return "5f0c2e8a-1b7d-4c3e-9a6f-2d4b8e1c7a90"
    text = WORDS[variant % len(WORDS)]
    minimum = schema.get("minLength")
    if isinstance(minimum, int) and len(text) < minimum:
        text = (text * (minimum // len(text) + 1))[: max(minimum, len(text))]
    maximum = schema.get("maxLength")
    return text[:maximum] if isinstance(maximum, int) and maximum >= 0 else text


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref.lstrip("#/").split("/"):
        if not part:
            continue
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    return out
