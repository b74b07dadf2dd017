"""Embed a JSON schema inside another one without breaking its ``$ref`` s.

A tool's ``parameters`` schema is its own document: ``{"$ref": "#/$defs/Addr"}`` (what
pydantic writes for a nested model, and ``openai.pydantic_function_tool`` sends) points into
that document. Placed under ``/items/anyOf/0/properties/parameters`` of a larger schema, every
local reference must point there too: :func:`rebase_refs` prefixes each ``#...`` reference
with the JSON pointer of the new place (``#`` itself, a reference to the whole tool schema,
becomes that pointer). References to other documents are left as they are.
"""

from __future__ import annotations

from typing import Any


def pointer_part(key: str) -> str:
    """``key`` escaped as one JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def rebase_refs(schema: Any, base: str) -> Any:
    """A copy of ``schema`` whose local ``$ref`` s point into it at JSON pointer ``base``
    (``""`` = the root, nothing changes)."""
    if not base:
        return schema
    if isinstance(schema, list):
        return [rebase_refs(x, base) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = f"#{base}{value[1:]}"
        elif key in ("enum", "const", "default", "examples"):
            out[key] = value  # data, not schemas
        else:
            out[key] = rebase_refs(value, base)
    return out
