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
- The answer: ``output`` holds one assistant ``message`` with one ``output_text`` part; a
  reply cut by ``max_output_tokens`` has ``status: "incomplete"`` and
  ``incomplete_details.reason: "max_output_tokens"``; ``usage`` counts input, cached and
  output tokens.

Nothing is stored (``store`` is accepted, informational): ``previous_response_id`` is a 400,
and so are ``tools`` (send chat completions for tool calls), non-text input parts and any
field not listed here, each naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import RequestOutput
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
    input: str | list[InputMessage]
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
    if req.tools:
        raise APIError(
            400,
            "tools: not served on /v1/responses; use /v1/chat/completions for tool calls",
            param="tools",
        )
    if req.tool_choice not in (None, "none", "auto"):
        raise APIError(400, "tool_choice: no tools were given", param="tool_choice")
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        messages += [{"role": m.role, "content": _message_text(m)} for m in req.input]
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
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "text.format: type 'json_schema' needs schema", param="text")
        spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.json_schema}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return p.ChatCompletionRequest.model_validate(body)


def renamed(exc: APIError) -> APIError:
    """An error of the rewritten chat request, naming the Responses field instead."""
    param = CHAT_TO_RESPONSES.get(exc.param or "", exc.param)
    message = exc.message
    if exc.param in CHAT_TO_RESPONSES and message.startswith(f"{exc.param}"):
        message = f"{param}{message[len(exc.param or '') :]}"
    return APIError(exc.status, message, param=param, code=exc.code)


def usage_block(out: RequestOutput) -> dict[str, Any]:
    """The Responses ``usage`` of a finished output."""
    num_out = sum(len(c.token_ids) for c in out.outputs)
    return {
        "input_tokens": out.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
        "output_tokens": num_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": out.num_prompt_tokens + num_out,
    }


def text_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """The assistant ``message`` output item (no content yet when ``text`` is None)."""
    content = [] if text is None else [text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def response_object(
    req: ResponsesRequest,
    response_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object (``status``: in_progress, completed or incomplete)."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    text_format: dict[str, Any] = {"type": "text"}
    if fmt is not None:
        text_format = fmt.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "model": model,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice or "auto",
        "tools": [],
        "text": {"format": text_format},
        "store": False,
        "usage": usage,
    }


def final_status(out: RequestOutput) -> str:
    """``completed``, or ``incomplete`` when the reply hit ``max_output_tokens``."""
    reason = out.outputs[0].finish_reason if out.outputs else None
    return "incomplete" if reason == "length" else "completed"
