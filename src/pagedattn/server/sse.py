"""Server-sent events for streamed completions and chat completions (OpenAI's chunk format:
``data: <json>`` lines, a final ``data: [DONE]``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pagedattn.engine.outputs import RequestOutput
from pagedattn.server import protocol as p
from pagedattn.server.errors import error_body


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
    then ``data: [DONE]``. Cancellation (client gone) aborts the request via ``outputs``."""
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
        async for out in outputs:
            completion = out.outputs[0]
            if out.error is not None:
                yield _event(error_body(400, out.error, code=completion.finish_reason))
                break
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
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
