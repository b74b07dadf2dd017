"""The answers of ``/v1/responses`` (:mod:`pagedattn.server.responses_api`): the ``response``
object, its output items (the assistant ``message`` with its ``output_text`` part, one
``function_call`` per tool call) and its ``usage``, in the OpenAI Responses API's shapes."""

from __future__ import annotations

from typing import Any

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import RequestOutput
from pagedattn.server.responses_api import ResponsesRequest


def output_items(message: p.AssistantMessage, status: str) -> list[dict[str, Any]]:
    """The output items of a finished reply: its message (when it has text or no calls),
    then one ``function_call`` per call."""
    items = []
    if message.content or not message.tool_calls:
        items.append(message_item(p.random_id("msg_"), message.content or "", status))
    for call in message.tool_calls or []:
        items.append(function_call_item(call))
    return items


def function_call_item(call: p.ToolCall, arguments: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output item (``arguments`` instead of the call's own, e.g. ``""``
    when a streamed item is announced)."""
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.function.name,
        "arguments": call.function.arguments if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }


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
        "tools": req.tools or [],
        "text": {"format": text_format},
        "store": False,
        "usage": usage,
    }


def final_status(out: RequestOutput) -> str:
    """``completed``, or ``incomplete`` when the reply hit ``max_output_tokens``."""
    reason = out.outputs[0].finish_reason if out.outputs else None
    return "incomplete" if reason == "length" else "completed"
