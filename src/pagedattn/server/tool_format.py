"""The tool-call format a chat template writes, found by rendering it, and its grammar.

A template "has a tool format" when an assistant message carrying a tool call renders as
Hermes-style text: ``<tool_call>`` + a JSON object with the function's ``name`` and its
``arguments`` (or ``parameters``) + ``</tool_call>`` (Qwen2.5, Hermes 2/3 and SmolLM3's
templates write this). The probe renders a conversation with a sentinel call and reads the
format back from the text; a template that ignores ``tool_calls`` (SmolLM2's, plain ChatML)
has none.

:func:`auto_grammar` is the llguidance Lark grammar of ``tool_choice: "auto"``: free text that
never contains the opening tag, or free text up to the first ``<tool_call>`` (a lazy lexeme:
the trigger) followed by calls whose JSON is constrained to an allowed tool and its argument
schema. Once the model writes the opening tag, the rest of the call is always valid (the
lazy-trigger rules are :mod:`pagedattn.server.trigger_grammar`'s).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from pagedattn.engine.guided import JSON_LAYOUT, narrow_one_of
from pagedattn.server.schema_refs import pointer_part, rebase_refs
from pagedattn.server.trigger_grammar import free_text_rule, head_rules, literal, regex_escape

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_SENTINEL_NAME = "probe_fn_7f3a"
_SENTINEL_KEY = "probe_arg_7f3a"


@dataclass(frozen=True)
class ToolFormat:
    """A Hermes-style tool-call format: ``open_tag`` JSON ``close_tag``, the JSON holding
    ``name`` and ``args_key`` (``"arguments"`` or ``"parameters"``)."""

    open_tag: str = OPEN_TAG
    close_tag: str = CLOSE_TAG
    args_key: str = "arguments"


def probe_messages() -> list[dict[str, Any]]:
    """A user turn and an assistant turn carrying one sentinel tool call (arguments as a
    dict, as chat templates expect them)."""
    call = {
        "id": "call_probe",
        "type": "function",
        "function": {"name": _SENTINEL_NAME, "arguments": {_SENTINEL_KEY: 1}},
    }
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]


def probe_tools() -> list[dict[str, Any]]:
    params = {"type": "object", "properties": {_SENTINEL_KEY: {"type": "integer"}}}
    return [{"type": "function", "function": {"name": _SENTINEL_NAME, "parameters": params}}]


def format_of_rendered(text: str) -> ToolFormat | None:
    """The format of a rendered probe conversation, or None when the sentinel call is not
    written inside ``<tool_call>`` ... ``</tool_call>`` as JSON."""
    start = text.rfind(OPEN_TAG)
    if start < 0:
        return None
    end = text.find(CLOSE_TAG, start)
    if end < 0:
        return None
    body = text[start + len(OPEN_TAG) : end].strip()
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") != _SENTINEL_NAME:
        return None
    for key in ("arguments", "parameters"):
        if isinstance(call.get(key), dict) and _SENTINEL_KEY in call[key]:
            return ToolFormat(args_key=key)
    return None


class FormatCache:
    """:func:`format_of_rendered` of each template source, rendered once (thread-safe)."""

    def __init__(self) -> None:
        self._formats: dict[str | None, ToolFormat | None] = {}
        self._lock = threading.Lock()

    def format_of(self, tokenizer: Any, chat_template: str | None) -> ToolFormat | None:
        """The tool format of ``chat_template`` (None = the model's own template)."""
        key = chat_template if chat_template is not None else tokenizer.chat_template
        with self._lock:
            if key in self._formats:
                return self._formats[key]
        try:
            text = tokenizer.apply_chat_template(
                probe_messages(),
                add_generation_prompt=False,
                chat_template=chat_template,
                tools=probe_tools(),
            )
            found = format_of_rendered(str(text))
        except (ValueError, TypeError, KeyError):
            found = None
        with self._lock:
            self._formats[key] = found
        return found


def call_schema(
    tools: list[tuple[str, dict[str, Any]]], args_key: str, base: str = ""
) -> dict[str, Any]:
    """The JSON schema of one call: ``{"name": <an allowed name>, args_key: <its arguments>}``
    (one ``anyOf`` branch per tool, names as constants, so branches are disjoint). Each tool's
    local ``$ref`` s are rebased to where its schema now sits (``base``: the JSON pointer of
    this call schema in the whole document)."""
    many = len(tools) > 1
    branches = []
    for i, (name, params) in enumerate(tools):
        at = f"{base}{f'/anyOf/{i}' if many else ''}/properties/{pointer_part(args_key)}"
        branches.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    args_key: rebase_refs(narrow_one_of(params), at),
                },
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    return {"anyOf": branches} if many else branches[0]


def auto_grammar(
    tools: list[tuple[str, dict[str, Any]]],
    fmt: ToolFormat,
    parallel: bool,
    special: frozenset[str] = frozenset(),
) -> str:
    """The Lark grammar of ``tool_choice: "auto"`` in ``fmt``: text without the opening tag,
    or text, then one call (several with ``parallel``, separated by whitespace), then the end
    of the output.

    Args:
        special: the tags that are one special token of the vocabulary (llguidance matches a
            special token only by name, never as text); each may come as its text or as that
            token.
    """
    schema = {**call_schema(tools, fmt.args_key), "x-guidance": dict(JSON_LAYOUT)}
    more = " (sep body)*" if parallel else ""
    open_re = regex_escape(fmt.open_tag)
    as_token = fmt.open_tag in special
    lines = [
        "%llguidance {}",
        f"start: TEXT | head body{more} WS",
        *head_rules("head", fmt.open_tag, special),
        f"sep: SEP{f' | WS {fmt.open_tag}' if as_token else ''}",
        f"close: {literal(fmt.close_tag, special)}",
        "body: NL call NL close",
        f"SEP: /[ \\n]*{open_re}/",
        "NL: /\\n?/",
        "WS: /[ \\n]*/",
        f"call: %json {json.dumps(schema)}",
        free_text_rule([fmt.open_tag]),
    ]
    return "\n".join(lines)


def parse_calls(text: str, fmt: ToolFormat) -> tuple[str | None, list[tuple[str, Any]]] | None:
    """Split a reply written in ``fmt`` into (content before the first call, stripped, None
    when empty; [(name, arguments), ...]). None when it has no complete call or a call is
    not a JSON object with a string ``name`` and object arguments."""
    start = text.find(fmt.open_tag)
    if start < 0:
        return None
    content = text[:start].strip() or None
    calls: list[tuple[str, Any]] = []
    pos = start
    while True:
        pos = text.find(fmt.open_tag, pos)
        if pos < 0:
            break
        end = text.find(fmt.close_tag, pos)
        if end < 0:
            return None
        try:
            call = json.loads(text[pos + len(fmt.open_tag) : end])
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        args = call.get(fmt.args_key, {})
        if not isinstance(args, dict):
            return None
        calls.append((call["name"], args))
        pos = end + len(fmt.close_tag)
    return content, calls
