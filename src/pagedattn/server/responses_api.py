"""``POST /v1/responses``: OpenAI's Responses API for text, on the chat machinery.

A request is rewritten as the chat completion it means and runs as one (the chat template,
limits, sampling and structured output of :mod:`pagedattn.server.prepare` and
:mod:`pagedattn.server.structured`):

- ``input``: a string (one user message) or a list of messages ``{"role", "content"}``
  (``type: "message"`` optional), ``content`` a string or a list of ``input_text`` /
  ``output_text`` parts; ``instructions`` becomes a leading system message.
- ``max_output_tokens``, ``temperature``, ``top_p``; ``text.format``: ``{"type": "text"}``,
  ``{"type": "json_object"}`` or ``{"type": "json_schema", "name", "schema", "strict"}`` (a
  token mask, as ``response_format``).
- ``stream: true``: server-sent events ``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``, one
  ``response.output_text.delta`` per piece of text, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, ``response.completed``
  (:mod:`pagedattn.server.responses_stream`).
- ``tools`` (``{"type": "function", "name", "description", "parameters"}``), ``tool_choice``
  (``"none"``, ``"auto"``, ``"required"``, ``{"type": "function", "name"}``) and
  ``parallel_tool_calls``: the chat route's tool calling (:mod:`pagedattn.server.tools`:
  grammar-constrained calls). A call is a ``function_call`` output item (``call_id``,
  ``name``, ``arguments`` as JSON text); the next turn sends it back as a ``function_call``
  input item followed by a ``function_call_output`` item (``call_id``, ``output``), which
  reach the chat template as the assistant's ``tool_calls`` and a ``tool`` message.
- The answer: ``output`` holds the assistant ``message`` (one ``output_text`` part; left out
  when the reply is only calls) and the calls; a reply cut by ``max_output_tokens`` has
  ``status: "incomplete"`` and ``incomplete_details.reason: "max_output_tokens"``; ``usage``
  counts input, cached and output tokens.

Nothing is stored (``store`` is accepted, informational): ``previous_response_id`` is a 400,
and so are tools other than functions, non-text input parts and any field not listed here,
each naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

import pagedattn.server.protocol as p
from pagedattn.server.errors import APIError
from pagedattn.server.request_base import OpenAIRequest

# chat request fields -> the Responses field a client sent them as (for error messages)
CHAT_TO_RESPONSES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text",
}


class InputText(OpenAIRequest):
    """A text part of an input message (``input_text``, or ``output_text`` in history)."""

    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(OpenAIRequest):
    """One message of ``input``."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]


class FunctionCallItem(OpenAIRequest):
    """A call the model made earlier (``function_call``), sent back as input."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(OpenAIRequest):
    """The result of a call (``function_call_output``)."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem


class TextFormat(OpenAIRequest):
    """``text.format``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(OpenAIRequest):
    """``text``: the output's format."""

    format: TextFormat | None = None


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses`` (see the module docstring)."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    text: TextConfig | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # informational: accepted, never change the output
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None


def _message_text(m: InputMessage) -> str:
    return m.content if isinstance(m.content, str) else "".join(part.text for part in m.content)


def chat_request(req: ResponsesRequest) -> p.ChatCompletionRequest:
    """The chat completion a Responses request means.

    Raises:
        APIError: 400 naming the field for what is not served (unknown fields,
            ``previous_response_id``, ``tools``).
    """
    extra = req.model_extra or {}
    if extra:
        name = next(iter(extra))
        raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if req.previous_response_id is not None:
        raise APIError(
            400,
            "previous_response_id: responses are not stored; send the whole conversation as input",
            param="previous_response_id",
        )
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        messages += _messages(req.input)
    if not messages:
        raise APIError(400, "input: expected at least one message", param="input")
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
    }
    if req.model is not None:
        body["model"] = req.model
    if req.tools:
        body["tools"] = [_chat_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "text.format: type 'json_schema' needs schema", param="text")
        spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.json_schema}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return p.ChatCompletionRequest.model_validate(body)


def _messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Chat messages of input items: consecutive ``function_call`` items are one assistant
    message's ``tool_calls``, a ``function_call_output`` a ``tool`` message."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, InputMessage):
            out.append({"role": item.role, "content": _message_text(item)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return out


def _chat_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise APIError(
            400,
            f"tools[{i}]: only function tools are served ({{'type': 'function', 'name', "
            f"'parameters'}}), got type {tool.get('type')!r}",
            param="tools",
        )
    fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(
                400,
                "tool_choice: expected 'none', 'auto', 'required' or {'type': 'function', "
                "'name': ...}",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def renamed(exc: APIError) -> APIError:
    """An error of the rewritten chat request, naming the Responses field instead."""
    param = CHAT_TO_RESPONSES.get(exc.param or "", exc.param)
    message = exc.message
    if exc.param in CHAT_TO_RESPONSES and message.startswith(f"{exc.param}"):
        message = f"{param}{message[len(exc.param or '') :]}"
    return APIError(exc.status, message, param=param, code=exc.code)
