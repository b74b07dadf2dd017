"""Twenty tool ``parameters`` schemas (object schemas, as tools take): the structured-output
schemas of :mod:`tests.server.schemas` that are objects, the others wrapped as one property,
and ``oneOf`` unions (discriminated objects, objects told apart by their keys, a oneOf inside
an array), every value bounded so that a call fits ``MAX_TOKENS``."""

from __future__ import annotations

from typing import Any

from tests.server.schemas import MAX_TOKENS, SCHEMAS, SHORT_STR, SMALL_INT, obj


def as_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema as it is, anything else as the one required property ``value``."""
    return schema if schema.get("type") == "object" else obj({"value": schema})


CIRCLE = {
    "type": "object",
    "properties": {"kind": {"const": "circle"}, "r": SMALL_INT},
    "required": ["kind", "r"],
}
SQUARE = {
    "type": "object",
    "properties": {"kind": {"const": "square"}, "side": SMALL_INT},
    "required": ["kind", "side"],
}
ONE_OF: list[dict[str, Any]] = [
    obj({"shape": {"oneOf": [CIRCLE, SQUARE]}}),
    obj(
        {
            "target": {
                "oneOf": [
                    {"type": "object", "properties": {"email": SHORT_STR}, "required": ["email"]},
                    {"type": "object", "properties": {"phone": SMALL_INT}, "required": ["phone"]},
                ]
            }
        }
    ),
    obj({"items": {"type": "array", "maxItems": 2, "items": {"oneOf": [SHORT_STR, SMALL_INT]}}}),
]
TOOL_SCHEMAS: list[dict[str, Any]] = [as_parameters(s) for s in SCHEMAS[:17]] + ONE_OF

assert len(TOOL_SCHEMAS) == 20
__all__ = ["MAX_TOKENS", "TOOL_SCHEMAS", "as_parameters"]
