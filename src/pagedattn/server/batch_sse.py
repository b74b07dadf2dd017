"""Server-sent events of a completions request with several prompts
(:mod:`pagedattn.server.batch_prompts`): the chunks of every prompt's choices interleave as
the engine produces them, each chunk carrying one choice under its response index
(``prompt_index * n + i``); the chunks of each choice are those the prompt alone streams
(:mod:`pagedattn.server.sse`). After every choice finished: an optional usage chunk summed
over the prompts, then ``data: [DONE]``; a prompt that fails ends the stream with a final
``data: {"error": ...}`` event and aborts the others."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import CompletionOutput, RequestOutput
from pagedattn.server.batch_prompts import choice_index, merge_streams
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError
from pagedattn.server.prepared import Prepared
from pagedattn.server.responses import completion_choice
from pagedattn.server.sse import _error_event, _event, failure_of


async def batch_sse_events(
    streams: Sequence[AsyncIterator[RequestOutput]],
    prepared: Sequence[Prepared],
    request_id: str,
    model: str,
    usage: bool,
    decode: Callable[[int], str],
    on_unexpected: Callable[[BaseException], None] | None = None,
    continuous: bool = False,
) -> AsyncIterator[str]:
    """The events of one completions request with several prompts (see the module
    docstring); ``streams[k]`` runs ``prepared[k]``. Cancellation (client gone) aborts every
    prompt's request. ``continuous``: every chunk carries its choice's usage so far (its
    prompt's tokens, the tokens it generated), as :func:`pagedattn.server.sse.sse_events`."""
    created = p.now_s()
    offsets: dict[int, int] = {}  # text_offset so far, per response index
    last: dict[int, RequestOutput] = {}  # each prompt's latest output (its token counts)
    num_generated = 0
    started: set[int] = set()
    generated: dict[int, int] = {}  # tokens generated so far, per response index
    prompt_sent: set[int] = set()  # response indices whose prompt token ids went out

    def chunk(k: int, out: RequestOutput, c: CompletionOutput, prompt: bool, finish: bool) -> str:
        prep = prepared[k]
        index = choice_index(k, prep, c.index)
        choice = completion_choice(
            out,
            c,
            prep,
            decode,
            with_prompt=prompt,
            initial_offset=offsets.get(index, 0),
            finish=finish,
            prompt_ids=index not in prompt_sent,
        )
        prompt_sent.add(index)
        if choice.logprobs is not None:
            offsets[index] = offsets.get(index, 0) + sum(map(len, choice.logprobs.tokens))
        choice = choice.model_copy(update={"index": index})
        counts = None
        if continuous:
            num_prompt = len(prep.prompt_token_ids)
            counts = p.make_usage(num_prompt, generated.get(index, 0), out.num_cached_tokens)
        body = p.Completion(
            id=request_id, created=created, model=model, choices=[choice], usage=counts
        )
        return _event(p.dump(body))

    merged = merge_streams(streams)
    try:
        async for k, out in merged:
            failure = failure_of(out) if out.finished else None
            if failure is not None:
                raise failure
            prep = prepared[k]
            if k not in started:
                started.add(k)
                if prep.echo_text is not None:
                    for i in range(prep.params.n):
                        yield chunk(k, out, CompletionOutput(index=i), True, False)
            last[k] = out
            for c in out.outputs:
                num_generated += len(c.token_ids)
                index = choice_index(k, prep, c.index)
                generated[index] = generated.get(index, 0) + len(c.token_ids)
                with_ids = prep.token_ids and c.token_ids
                if c.text or with_ids or (prep.num_top is not None and c.token_ids):
                    yield chunk(k, out, c, False, False)
                if c.finish_reason is not None:
                    empty = CompletionOutput(
                        index=c.index, finish_reason=c.finish_reason, stop_reason=c.stop_reason
                    )
                    yield chunk(k, out, empty, False, True)
        if usage:
            counts = p.make_usage(
                sum(out.num_prompt_tokens for out in last.values()),
                num_generated,
                sum(out.num_cached_tokens for out in last.values()),
            )
            body = p.Completion(
                id=request_id, created=created, model=model, choices=[], usage=counts
            )
            yield _event(p.dump(body))
    except Exception as exc:  # the final event carries the error: no truncated body
        if not isinstance(exc, (APIError, EngineDeadError)) and on_unexpected is not None:
            on_unexpected(exc)
        yield _error_event(exc)
        return
    finally:
        await merged.aclose()  # closes every prompt's stream: aborts those still running
    yield "data: [DONE]\n\n"
