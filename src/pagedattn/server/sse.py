"""Server-sent events for streamed completions and chat completions (OpenAI's chunk format:
``data: <json>`` lines, a final ``data: [DONE]``). A request with ``n`` choices interleaves
chunks of every choice, each carrying its ``index``; chunks carry their tokens' logprobs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from pagedattn.engine.outputs import CompletionOutput, RequestOutput
from pagedattn.server import protocol as p
from pagedattn.server.errors import error_body
from pagedattn.server.responses import (
    chat_choice_logprobs,
    completion_choice,
    openai_finish_reason,
    usage_of,
)

if TYPE_CHECKING:
    from pagedattn.server.serving import Prepared


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def sse_events(
    outputs: AsyncIterator[RequestOutput],
    request_id: str,
    model: str,
    chat: bool,
    usage: bool,
    prepared: Prepared,
    decode: Callable[[int], str],
) -> AsyncIterator[str]:
    """Server-sent events: per choice a chunk per delta that has text or logprobs (under
    completions ``echo`` the prompt first), its finish chunk, an optional usage chunk, then
    ``data: [DONE]``. Cancellation (client gone) aborts the request via ``outputs``."""
    created = p.now_s()
    offsets: dict[int, int] = {}  # completions text_offset so far, per choice

    def completion(out: RequestOutput, c: CompletionOutput, prompt: bool, finish: bool) -> str:
        choice = completion_choice(
            out,
            c,
            prepared,
            decode,
            with_prompt=prompt,
            initial_offset=offsets.get(c.index, 0),
            finish=finish,
        )
        if choice.logprobs is not None:
            offsets[c.index] = offsets.get(c.index, 0) + sum(map(len, choice.logprobs.tokens))
        body = p.Completion(id=request_id, created=created, model=model, choices=[choice])
        return _event(p.dump(body))

    def chat_chunk(index: int, delta: p.ChatDelta, c: CompletionOutput | None, fin: bool) -> str:
        logprobs = None if c is None or fin else chat_choice_logprobs(c, prepared, decode)
        reason = openai_finish_reason(c) if fin and c is not None else None
        choice = p.ChatChunkChoice(
            index=index, delta=delta, logprobs=logprobs, finish_reason=reason
        )
        data = p.dump(
            p.ChatCompletionChunk(id=request_id, created=created, model=model, choices=[choice])
        )
        # like OpenAI, a delta lists only the fields it sets
        data["choices"][0]["delta"] = {
            k: v for k, v in data["choices"][0]["delta"].items() if v is not None
        }
        return _event(data)

    try:
        if chat:
            for i in range(prepared.params.n):
                yield chat_chunk(i, p.ChatDelta(role="assistant", content=""), None, False)
        num_generated = 0
        first = True
        async for out in outputs:
            if out.error is not None:
                reason = out.outputs[0].finish_reason if out.outputs else None
                yield _event(error_body(400, out.error, code=reason))
                break
            if first and not chat and prepared.echo_text is not None:
                for i in range(prepared.params.n):
                    yield completion(out, CompletionOutput(index=i), True, False)
            first = False
            for c in out.outputs:
                num_generated += len(c.token_ids)
                has_logprobs = prepared.num_top is not None and c.token_ids
                if c.text or has_logprobs:
                    if chat:
                        yield chat_chunk(c.index, p.ChatDelta(content=c.text), c, False)
                    else:
                        yield completion(out, c, False, False)
                if c.finish_reason is not None:
                    if chat:
                        yield chat_chunk(c.index, p.ChatDelta(), c, True)
                    else:
                        empty = CompletionOutput(
                            index=c.index,
                            finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason,
                        )
                        yield completion(out, empty, False, True)
            if out.finished and usage:
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
