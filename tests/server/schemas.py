"""Twenty varied, bounded JSON schemas (every string, array and integer has a bound, objects
forbid extra keys), so that any output the grammar allows fits ``MAX_TOKENS`` tokens."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 160

SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}
SHORT_STR = {"type": "string", "minLength": 1, "maxLength": 8}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS: list[dict[str, Any]] = [
    obj({"name": SHORT_STR}),
    obj({"age": SMALL_INT}),
    obj({"ok": {"type": "boolean"}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"digits": {"type": "array", "items": SMALL_INT, "minItems": 1, "maxItems": 3}}),
    obj({"person": obj({"first": SHORT_STR, "age": SMALL_INT})}),
    obj({"kind": {"const": "point"}, "x": SMALL_INT, "y": SMALL_INT}),
    obj({"code": {"type": "string", "pattern": "^[a-z]{2,4}$"}}),
    obj({"value": {"anyOf": [SMALL_INT, {"type": "boolean"}]}}),
    obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}}),
    obj({"title": SHORT_STR, "year": SMALL_INT, "draft": {"type": "boolean"}}, ["title"]),
    obj({"nothing": {"type": "null"}}),
    obj({"city": SHORT_STR, "country": {"type": "string", "maxLength": 3}, "pop": SMALL_INT}),
    {
        "type": "array",
        "items": obj({"id": SMALL_INT}),
        "minItems": 1,
        "maxItems": 2,
    },
    obj({"level": {"enum": [1, 2, 3, 5, 8]}}),
    obj({"initials": {"type": "string", "minLength": 1, "maxLength": 3}}),
    {"type": "array", "prefixItems": [SMALL_INT, {"type": "boolean"}], "items": False},
    {
        "$defs": {"pt": obj({"x": SMALL_INT, "y": SMALL_INT})},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    {"enum": ["yes", "no", "maybe"]},
    obj({"answer": {"type": "string", "enum": ["Paris", "London", "Rome"]}, "sure": SMALL_INT}),
]
