"""vLLM's structural tag: free text with JSON segments that open on a trigger.

Sent as ``structured_outputs.structural_tag`` (an object, or its JSON text) or as
``response_format: {"type": "structural_tag", ...}``, in the form vLLM's ``guidance`` backend
serves (xgrammar's legacy structural tag)::

    {"type": "structural_tag",             # optional under structured_outputs
     "structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

The output is free text until one of the triggers appears; the trigger must be the start of a
structure's ``begin`` (the first listed trigger that ``begin`` starts with), the rest of
``begin`` follows, then JSON valid for that structure's ``schema`` (laid out as every JSON
output: ``{"a": 1, "b": [1, 2]}``), then ``end``, then free text again; any number of
segments. Free text never contains a trigger other than as the start of a segment. A trigger
no structure starts with has no effect.

Refused, with a 400 naming the field's path (``...structures[0].schema``): unknown keys
(xgrammar's newer ``format`` form among them), no structures, a ``begin`` that starts with no
trigger, an empty trigger, a trigger that contains another one (the first would always fire
first), a missing or invalid schema, and one without an instance (a segment that could
never end).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pagedattn.engine.guided import JSON_LAYOUT, narrow_one_of
from pagedattn.server.errors import APIError
from pagedattn.server.structured_outputs import no_additional_properties
from pagedattn.server.trigger_grammar import free_text_rule, head_rules, literal

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _no_special(texts: tuple[str, ...]) -> frozenset[str]:
    return frozenset()


def _compiles(schema: dict[str, Any], where: str) -> None:
    import llguidance as llg

    error = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_json_schema(schema))
    if error:
        raise APIError(400, f"{where}: invalid JSON schema: {error}", param=where)


@dataclass(frozen=True)
class Vocabulary:
    """What a structural tag's grammar needs from the model's vocabulary.

    Attributes:
        special: which of the given texts are one special token of the vocabulary.
        check_schema: raises APIError 400 naming the given field path when the JSON schema
            does not compile or admits no output (the default only compiles it, without a
            tokenizer).
    """

    special: Callable[[tuple[str, ...]], frozenset[str]] = _no_special
    check_schema: Callable[[dict[str, Any], str], None] = _compiles


class TagStructure(BaseModel):
    """One structure: ``begin`` (starts with a trigger), JSON for ``schema``, ``end``."""

    model_config = _STRICT

    begin: str
    structure_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    end: str


class StructuralTag(BaseModel):
    """The structural tag (see the module docstring)."""

    model_config = _STRICT

    type: Literal["structural_tag"] = "structural_tag"
    structures: list[TagStructure]
    triggers: list[str]


def _path(field: str, loc: Sequence[int | str]) -> str:
    out = field
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_structural_tag(value: Any, field: str) -> StructuralTag:
    """The structural tag ``value`` (a dict, or its JSON text) sent as ``field``.

    Raises:
        APIError: 400 naming the path of what is wrong.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise APIError(400, f"{field}: not JSON: {exc}", param=field) from exc
    if not isinstance(value, dict):
        raise APIError(400, f"{field}: expected an object", param=field)
    if "format" in value:
        where = f"{field}.format"
        raise APIError(
            400,
            f"{where}: xgrammar's structural tag format is not served; send 'structures' "
            "and 'triggers'",
            param=where,
        )
    try:
        tag = StructuralTag.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _path(field, first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", param=where) from exc
    _check(tag, field)
    return tag


def _check(tag: StructuralTag, field: str) -> None:
    if not tag.structures:
        where = f"{field}.structures"
        raise APIError(400, f"{where}: expected at least one structure", param=where)
    for i, trigger in enumerate(tag.triggers):
        where = f"{field}.triggers[{i}]"
        if not trigger:
            raise APIError(400, f"{where}: a trigger must not be empty", param=where)
        for j, other in enumerate(tag.triggers[:i]):
            if trigger in other or other in trigger:
                raise APIError(
                    400,
                    f"{where}: {trigger!r} and triggers[{j}] {other!r}: one contains the other",
                    param=where,
                )
    for i, s in enumerate(tag.structures):
        where = f"{field}.structures[{i}]"
        if trigger_of(tag, s) is None:
            raise APIError(
                400,
                f"{where}.begin: {s.begin!r} starts with none of the triggers {tag.triggers}",
                param=f"{where}.begin",
            )
        if s.structure_schema is None:
            raise APIError(400, f"{where}.schema: expected a JSON schema", param=f"{where}.schema")


def trigger_of(tag: StructuralTag, structure: TagStructure) -> str | None:
    """The first trigger ``structure.begin`` starts with."""
    return next((t for t in tag.triggers if structure.begin.startswith(t)), None)


def structural_tag_grammar(
    tag: StructuralTag, field: str, vocabulary: Vocabulary, closed_objects: bool = False
) -> str:
    """The Lark grammar of a checked tag (from :func:`parse_structural_tag`).

    Args:
        field: the request field, named in errors.
        vocabulary: the model's special tokens and schema check.
        closed_objects: give every object schema ``additionalProperties: false`` unless it
            says otherwise (``disable_additional_properties``).

    Raises:
        APIError: 400 naming ``structures[i].schema`` for a schema that does not compile or
            has no instance (a segment that could never end).
    """
    triggers: dict[str, list[int]] = {}
    for i, s in enumerate(tag.structures):
        triggers.setdefault(str(trigger_of(tag, s)), []).append(i)
    # a special token is named in a grammar as its text, which must read ``<...>``
    texts = tuple(triggers) + tuple(s.end for s in tag.structures if s.end)
    specials = frozenset(
        t for t in vocabulary.special(texts) if t.startswith("<") and t.endswith(">")
    )
    lines = ["%llguidance {}", "start: seg* TEXT"]
    lines.append("seg: " + " | ".join(f"trig_{k}" for k in range(len(triggers))))
    for k, (trigger, members) in enumerate(triggers.items()):
        lines += head_rules(f"head_{k}", trigger, specials)
        lines.append(f"trig_{k}: head_{k} ({' | '.join(f'tag_{i}' for i in members)})")
        for i in members:
            s = tag.structures[i]
            schema = narrow_one_of(s.structure_schema)
            if closed_objects:
                schema = no_additional_properties(schema)
            schema = {**schema, "x-guidance": dict(JSON_LAYOUT)}
            vocabulary.check_schema(schema, f"{field}.structures[{i}].schema")
            rest = s.begin[len(trigger) :]
            parts = [json.dumps(rest)] if rest else []
            parts.append(f"body_{i}")
            if s.end:
                parts.append(literal(s.end, specials))
            lines.append(f"tag_{i}: {' '.join(parts)}")
            lines.append(f"body_{i}: %json {json.dumps(schema)}")
    lines.append(free_text_rule(triggers))
    return "\n".join(lines)
