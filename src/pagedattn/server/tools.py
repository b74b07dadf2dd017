"""Tool calling for chat completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

- ``tool_choice: "none"``: no call; the tools only reach the chat template.
- ``"required"``: the reply is a JSON array of calls ``[{"name": ..., "parameters": {...}}]``
  (one call unless ``parallel_tool_calls``), each an allowed tool with arguments valid for its
  ``parameters`` schema, enforced by the grammar (vLLM's layout for this mode).
- ``{"type": "function", "function": {"name": X}}``: the reply is X's arguments object, valid
  for its schema.
- ``"auto"`` (the default with tools): the model writes its own format, as its chat template
  writes tool calls (:mod:`pagedattn.server.tool_format`); a call it opens is constrained to
  an allowed tool and valid arguments. A template with no tool format is a 400 on
  ``tool_choice``.

A reply with calls has ``message.tool_calls`` (ids ``call_...``, arguments as JSON text) and
finish reason ``tool_calls``; one cut by ``max_tokens`` inside a call keeps its text as
``content`` with reason ``length``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pagedattn.server.protocol as p
from pagedattn.engine.guided import GuidedSpec, narrow_one_of
from pagedattn.server.errors import APIError
from pagedattn.server.tool_format import (
    FormatCache,
    ToolFormat,
    auto_grammar,
    call_schema,
    parse_calls,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
ToolMode = Literal["auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """How one request calls tools: ``mode``, the allowed ``(name, parameters)``, whether
    several calls may come at once, the template's format (``auto`` only) and the grammar."""

    mode: ToolMode
    tools: tuple[tuple[str, dict[str, Any]], ...]
    parallel: bool
    fmt: ToolFormat | None
    spec: GuidedSpec

    def parse(self, text: str) -> tuple[str | None, list[tuple[str, Any]]] | None:
        """(content, [(name, arguments)]) of a reply, or None when it holds no complete call
        (``auto`` without a call, or a reply cut short)."""
        try:
            if self.mode == "auto":
                assert self.fmt is not None
                return parse_calls(text, self.fmt)
            value = json.loads(text)
        except ValueError:
            return None
        if self.mode == "named":
            return (None, [(self.tools[0][0], value)]) if isinstance(value, dict) else None
        if not isinstance(value, list) or not value:
            return None
        calls: list[tuple[str, Any]] = []
        for call in value:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return None
            calls.append((call["name"], call.get("parameters", {})))
        return None, calls


def tool_calls_of(calls: list[tuple[str, Any]]) -> list[p.ToolCall]:
    """OpenAI ``tool_calls`` entries (fresh ids, arguments as JSON text)."""
    return [
        p.ToolCall(
            id=p.random_id("call_"),
            function=p.FunctionCall(name=name, arguments=json.dumps(args, ensure_ascii=False)),
        )
        for name, args in calls
    ]


def _tools(raw: list[dict[str, Any]]) -> tuple[tuple[str, dict[str, Any]], ...]:
    out: list[tuple[str, dict[str, Any]]] = []
    for i, tool in enumerate(raw):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(
                400,
                f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}",
                param="tools",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise APIError(
                400,
                f"tools[{i}].function.name: expected 1-64 of [A-Za-z0-9_-], got {name!r}",
                param="tools",
            )
        params = fn.get("parameters", _EMPTY_PARAMS)
        if not isinstance(params, dict):
            raise APIError(
                400, f"tools[{i}].function.parameters: expected a JSON schema", param="tools"
            )
        if any(name == n for n, _ in out):
            raise APIError(400, f"tools[{i}].function.name: {name!r} is given twice", param="tools")
        out.append((name, params))
    return tuple(out)


def _named(choice: dict[str, Any], names: list[str]) -> str:
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(
            400,
            "tool_choice: expected 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if name not in names:
        raise APIError(400, f"tool_choice: no tool named {name!r} in tools", param="tool_choice")
    return name


@dataclass
class ToolPlanner:
    """Builds a request's :class:`ToolPlan`; remembers each chat template's format."""

    tokenizer: Any
    special_tags: Callable[[ToolFormat], frozenset[str]] = lambda fmt: frozenset()
    formats: FormatCache = field(default_factory=FormatCache)

    def plan(self, req: p.ChatCompletionRequest) -> ToolPlan | None:
        """The request's plan, or None when it calls no tool (no tools, or ``"none"``).

        Raises:
            APIError: 400 for a malformed tool or ``tool_choice``, and for ``"auto"`` when the
                chat template writes no tool calls.
        """
        choice = req.tool_choice
        if not req.tools:
            return None  # a tool_choice without tools is refused with the request's fields
        tools = _tools(req.tools)
        if choice == "none":
            return None
        parallel = req.parallel_tool_calls is not False
        names = [n for n, _ in tools]
        if isinstance(choice, dict):
            name = _named(choice, names)
            params = dict(tools)[name]
            return ToolPlan("named", ((name, params),), False, None, _json(params))
        if choice == "required":
            return ToolPlan(
                "required", tools, parallel, None, _json(_array_schema(tools, parallel))
            )
        if choice not in (None, "auto"):
            raise APIError(
                400,
                f"tool_choice: expected 'none', 'auto' or 'required', got {choice!r}",
                param="tool_choice",
            )
        fmt = (
            None
            if self.tokenizer is None
            else self.formats.format_of(self.tokenizer, req.chat_template)
        )
        if fmt is None:
            raise APIError(
                400,
                "tool_choice: 'auto' needs a chat template that writes tool calls, and this "
                "one writes none (send tool_choice 'required' or a named function, or a "
                "chat_template that writes <tool_call> JSON </tool_call>)",
                param="tool_choice",
            )
        grammar = auto_grammar(list(tools), fmt, parallel, self.special_tags(fmt))
        return ToolPlan("auto", tools, parallel, fmt, GuidedSpec("grammar", grammar, "tools"))


def _json(schema: dict[str, Any]) -> GuidedSpec:
    return GuidedSpec("json", narrow_one_of(schema), "tools")


def _array_schema(tools: tuple[tuple[str, dict[str, Any]], ...], parallel: bool) -> Any:
    item = call_schema(list(tools), "parameters", base="/items")
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: an assistant message's ``tool_calls``
    arguments as objects (OpenAI clients send them as JSON text).

    Raises:
        APIError: 400 on ``messages`` for arguments that are not a JSON object's text.
    """
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list):
            m = {**m, "tool_calls": [_template_call(i, c) for c in calls]}
        out.append(m)
    return out


def _template_call(i: int, call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        raise APIError(
            400, f"messages[{i}].tool_calls: arguments are not JSON", param="messages"
        ) from None
    return {**call, "function": {**fn, "arguments": args}}
