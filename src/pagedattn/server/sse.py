"""Server-sent events for streamed completions and chat completions (OpenAI's chunk format:
``data: <json>`` lines, a final ``data: [DONE]``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pagedattn.engine.outputs import FINISH_ABORT, FINISH_ERROR, REJECTIONS, RequestOutput
from pagedattn.server import protocol as p
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError, error_body


def failure_of(out: RequestOutput) -> APIError | None:
    """The error response of a finished request that did not complete, else None: a rejection
    is a 400 naming its code, a request the engine failed a 500, one aborted by shutdown a
    503 (never a "stop")."""
    reason = out.outputs[0].finish_reason
    if reason in REJECTIONS:
        return APIError(400, out.error or str(reason), code=reason)
    if reason == FINISH_ERROR:
        return APIError(500, out.error or "the engine failed this request", code="engine_error")
    if reason == FINISH_ABORT:
        return APIError(503, "the request was aborted: the server is shutting down")
    return None


def _error_event(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return _event(error_body(exc.status, exc.message, exc.param, exc.code))
    if isinstance(exc, EngineDeadError):
        return _event(error_body(503, str(exc), code="engine_unavailable"))
    return _event(error_body(500, f"internal error: {type(exc).__name__}: {exc}"))


def finish_reason_of(out: RequestOutput) -> p.FinishReason | None:
    """OpenAI's finish reason of a request's first completion: "length" for the engine's
    "length", else "stop" (None while running)."""
    if not out.finished:
        return None
    return "length" if out.outputs[0].finish_reason == "length" else "stop"


def usage_of(out: RequestOutput, num_generated_tokens: int) -> p.Usage:
    """The usage block of a request's last output, given how many tokens it generated."""
    return p.make_usage(out.num_prompt_tokens, num_generated_tokens, out.num_cached_tokens)


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def sse_events(
    outputs: AsyncIterator[RequestOutput], request_id: str, model: str, chat: bool, usage: bool
) -> AsyncIterator[str]:
    """Server-sent events: one chunk per text delta, the finish chunk, an optional usage chunk,
    then ``data: [DONE]``. Cancellation (client gone) aborts the request via ``outputs``.

    A request that fails (rejected, failed by the engine, aborted by shutdown, the engine
    thread died) ends the stream with a final ``data: {"error": {...}}`` event (OpenAI's
    error body) instead of a finish chunk or ``[DONE]``."""
    created = p.now_s()

    def chunk(text: str | None, reason: p.FinishReason | None, role: bool = False) -> str:
        if chat:
            delta = p.ChatDelta(role="assistant" if role else None, content=text)
            c: Any = p.ChatCompletionChunk(
                id=request_id,
                created=created,
                model=model,
                choices=[p.ChatChunkChoice(delta=delta, finish_reason=reason)],
            )
        else:
            choice = p.CompletionChoice(text=text or "", finish_reason=reason)
            c = p.Completion(id=request_id, created=created, model=model, choices=[choice])
        data = p.dump(c)
        if chat:  # like OpenAI, a delta lists only the fields it sets
            delta_ = data["choices"][0]["delta"]
            data["choices"][0]["delta"] = {k: v for k, v in delta_.items() if v is not None}
        return _event(data)

    try:
        if chat:
            yield chunk("", None, role=True)
        num_generated = 0
        try:
            async for out in outputs:
                completion = out.outputs[0]
                failure = failure_of(out) if out.finished else None
                if failure is not None:
                    raise failure
                num_generated += len(completion.token_ids)
                if completion.text:
                    yield chunk(completion.text, None)
                if out.finished:
                    yield chunk(None if chat else "", finish_reason_of(out))
                    if usage:
                        cls: Any = p.ChatCompletionChunk if chat else p.Completion
                        last = cls(
                            id=request_id,
                            created=created,
                            model=model,
                            choices=[],
                            usage=usage_of(out, num_generated),
                        )
                        yield _event(p.dump(last))
        except Exception as exc:  # the final event carries the error: no truncated body
            yield _error_event(exc)
            return
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
