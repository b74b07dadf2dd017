"""Run a ``/v1/responses`` request and answer it: one ``response`` object, or the Responses
API's server-sent events (``event: <type>`` + ``data: <json>``, each with its
``sequence_number``) when ``stream`` is true (request rules: :mod:`.responses_api`)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import REJECTIONS, CompletionOutput, RequestOutput
from pagedattn.server.batch_prompts import collect_all
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError, error_body
from pagedattn.server.responses_api import ResponsesRequest, chat_request, renamed
from pagedattn.server.responses_output import (
    final_status,
    function_call_item,
    message_item,
    output_items,
    response_object,
    text_part,
    usage_block,
)
from pagedattn.server.serving import OpenAIServing
from pagedattn.server.sse import failure_of
from pagedattn.server.tool_replies import ToolStream, reply_of
from pagedattn.server.tools import ToolPlan


class ResponsesServing:
    """The ``/v1/responses`` handler of one server, on its chat machinery.

    Args:
        serving: the server's completion and chat handlers (their preparer, structured
            output and engine loop).
    """

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def respond(
        self, raw: Request, req: ResponsesRequest
    ) -> JSONResponse | StreamingResponse:
        """Run a validated Responses request and answer it."""
        arrival_time = time.monotonic()
        serving = self.serving
        engine = serving.async_engine
        try:
            chat = chat_request(req)
            prepared = await run_in_threadpool(serving.prepare.chat, chat)
            prepared = await run_in_threadpool(serving.constrained, chat, prepared)
        except APIError as exc:
            if exc.code in REJECTIONS and engine.metrics is not None:
                engine.metrics.count_rejection(exc.code)
            raise renamed(exc) from exc
        model = req.model or serving.served.name
        engine.start()
        if not engine.is_running:
            raise APIError(503, engine.death or "engine not running", code="engine_unavailable")
        response_id = p.random_id("resp_")
        outputs = engine.generate(
            prepared.prompt_token_ids, prepared.params, response_id, arrival_time
        )
        if req.stream:
            on_unexpected = None if engine.metrics is None else engine.metrics.count_unexpected
            body = response_events(req, outputs, response_id, model, prepared.tools, on_unexpected)
            return StreamingResponse(body, media_type="text/event-stream")
        try:
            finals = await collect_all(raw.is_disconnected, [outputs])
        except EngineDeadError as exc:
            raise APIError(503, str(exc), code="engine_unavailable") from exc
        if finals is None:
            return JSONResponse(error_body(499, "client disconnected"), status_code=499)
        final = finals[0]
        failure = failure_of(final)
        if failure is not None:
            raise failure
        message, _ = reply_of(final.outputs[0], prepared.tools)
        status = final_status(final)
        items = output_items(message, status)
        obj = response_object(req, response_id, p.now_s(), model, status, items, usage_block(final))
        return JSONResponse(obj)


async def response_events(
    req: ResponsesRequest,
    outputs: AsyncIterator[RequestOutput],
    response_id: str,
    model: str,
    plan: ToolPlan | None = None,
    on_unexpected: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[str]:
    """The Responses API's events for one request (see the module docstring): the message
    item opens with the first text (under a tool plan, the text before a call), each call is
    an item with its arguments in one delta; a request that fails ends with an ``error``
    event. Cancellation (client gone) aborts the request."""
    created = p.now_s()
    item_id = p.random_id("msg_")
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        data = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    place = {"item_id": item_id, "output_index": 0, "content_index": 0}
    stream = ToolStream(plan) if plan is not None else None
    text, num_out, opened = "", 0, False

    def open_message() -> Iterator[str]:
        nonlocal opened
        if not opened:
            opened = True
            item = message_item(item_id, None, "in_progress")
            yield event("response.output_item.added", output_index=0, item=item)
            yield event("response.content_part.added", part=text_part(""), **place)

    def send(delta: str) -> Iterator[str]:
        nonlocal text
        if delta:
            yield from open_message()
            text += delta
            yield event("response.output_text.delta", delta=delta, logprobs=[], **place)

    try:
        start = response_object(req, response_id, created, model, "in_progress", [])
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        final: RequestOutput | None = None
        choice = CompletionOutput(index=0)
        async for out in outputs:
            failure = failure_of(out) if out.finished else None
            if failure is not None:
                raise failure
            for c in out.outputs:
                num_out += len(c.token_ids)
                choice = c
                for chunk in send(c.text if stream is None else stream.feed(c.text)):
                    yield chunk
            final = out
        assert final is not None and final.finished
        status = final_status(final)
        calls: list[p.ToolCallDelta] = []
        if stream is not None:
            rest, calls, _ = stream.finish(choice)
            for chunk in send(rest):
                yield chunk
        items = []
        if opened or not calls:
            for chunk in open_message():
                yield chunk
            yield event("response.output_text.done", text=text, logprobs=[], **place)
            yield event("response.content_part.done", part=text_part(text), **place)
            items.append(message_item(item_id, text, status))
            yield event("response.output_item.done", output_index=0, item=items[-1])
        for call in calls:
            index = len(items)
            item = function_call_item(call)
            yield event(
                "response.output_item.added",
                output_index=index,
                item=function_call_item(call, arguments=""),
            )
            args = call.function.arguments
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", delta=args, **where)
            yield event("response.function_call_arguments.done", arguments=args, **where)
            yield event("response.output_item.done", output_index=index, item=item)
            items.append(item)
        usage = usage_block(final)  # the last delta's prompt counts; the whole reply's tokens
        usage["output_tokens"] = num_out
        usage["total_tokens"] = usage["input_tokens"] + num_out
        done = response_object(req, response_id, created, model, status, items, usage)
        yield event(f"response.{status}", response=done)
    except Exception as exc:  # the last event carries the error: no truncated body
        if not isinstance(exc, (APIError, EngineDeadError)) and on_unexpected is not None:
            on_unexpected(exc)
        if isinstance(exc, APIError):
            yield event("error", code=exc.code, message=exc.message, param=exc.param)
        else:
            yield event("error", code="engine_error", message=str(exc), param=None)
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
