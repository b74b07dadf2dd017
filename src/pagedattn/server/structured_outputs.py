"""vLLM's ``structured_outputs`` request field: the current spelling of the ``guided_*`` fields.

``{"json": schema | its JSON text, "regex": ..., "choice": [...], "grammar": Lark,
"json_object": true, "structural_tag": {...} | its JSON text}``: at most one constraint, the
same as ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` /
``response_format: json_object`` (:mod:`pagedattn.server.structured` serves both spellings; a
constraint given in both, or two constraints, is a 400 naming the second; the constraints are
read in :func:`pagedattn.server.structured.structured_output_specs`). Options:

- ``whitespace_pattern`` (JSON only): the whitespace regex between JSON tokens (as
  ``guided_whitespace_pattern``, which may not be given too).
- ``disable_additional_properties: true``: every object schema that does not say otherwise
  gets ``additionalProperties: false`` (only the listed properties may appear).
- ``disable_any_whitespace``: JSON is written without whitespace between tokens
  (``{"a": 1, "b": [1, 2]}``) unless ``whitespace_pattern`` says otherwise, whichever value is
  sent: vLLM's default (``false``) *allows* any whitespace, which the compact layout is one
  case of; it never requires any.
- ``disable_fallback``: there is one backend (llguidance) and never a fallback: accepted.
- ``structural_tag``: free text with JSON segments that open on a trigger
  (:mod:`pagedattn.server.structural_tag`; ``disable_additional_properties`` closes its
  object schemas too).

An unknown key is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from pagedattn.server.request_base import OpenAIRequest


class StructuredOutputs(OpenAIRequest):
    """vLLM's ``StructuredOutputsParams`` as a request field (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False


def no_additional_properties(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema (one with
    ``properties`` or ``type: "object"``) that does not set it; other keys kept."""
    if isinstance(schema, list):
        return [no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(
            value, dict
        ):
            out[key] = {k: no_additional_properties(v) for k, v in value.items()}
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value  # values, not schemas
        else:
            out[key] = no_additional_properties(value)
    is_object = "properties" in schema or schema.get("type") == "object"
    if is_object and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out
