"""Several prompts in one completions request.

``prompt`` may be one text, one list of token ids, or a list of either (the OpenAI API's and
vLLM's forms; lm-evaluation-harness and batch scripts send lists). Each prompt of a list is a
separate engine request with the request's sampling parameters, so the prompts share pages
through the prefix cache as any requests do, and the answer for each prompt is the one the
same request with that prompt alone gets:

- choices are indexed ``prompt_index * n + i`` (``i`` the choice of that prompt);
- ``seed`` applies to each prompt as if it were sent alone (choice ``i`` of every prompt
  draws from ``seed + i``), so a seeded batch repeats the seeded single requests;
- ``usage`` sums the prompts' prompt, completion and cached tokens;
- every prompt is validated (tokenised, its length and ``max_tokens`` checked) before any of
  them runs: one bad prompt is a 400 for the whole request, naming the prompt by its index;
- one prompt failing in the engine fails the request (its error answers it, the others are
  aborted), and so does a client that goes away.

A list of strings and a list of token-id lists are the only lists of prompts; a list mixing
them (or mixing ids and lists) is a 400 naming ``prompt`` (the request's strict types).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import RequestOutput, merge_delta
from pagedattn.server.errors import APIError
from pagedattn.server.prepared import Prepared
from pagedattn.server.responses import completion_choice

MAX_PROMPTS = 2048  # most prompts per request
DISCONNECT_POLL_S = 0.25
T = TypeVar("T")
Prompt = str | list[int]
# errors that depend on the prompt (named by its index in a request with several)
PROMPT_CODES = ("context_length_exceeded", "cache_capacity_exceeded")


def prompts_of(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    """The request's prompts, in order (one text or id list is a list of one).

    Raises:
        APIError: 400 naming ``prompt`` for an empty list or more than :data:`MAX_PROMPTS`.
    """
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt: expected a prompt, got an empty list", param="prompt")
    first = prompt[0]
    if not isinstance(first, (str, list)):
        return [list(prompt)]  # type: ignore[arg-type]
    if len(prompt) > MAX_PROMPTS:
        raise APIError(
            400,
            f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompt)}",
            param="prompt",
        )
    return list(prompt)  # type: ignore[arg-type]


def prepare_prompts(
    req: p.CompletionRequest, prepare: Callable[[p.CompletionRequest, Prompt], Prepared]
) -> list[Prepared]:
    """Every prompt of ``req`` prepared by ``prepare``; an error names the prompt's index
    when the request has several and the error is the prompt's. Raises APIError."""
    prompts = prompts_of(req.prompt)
    prepared = []
    for index, prompt in enumerate(prompts):
        try:
            prepared.append(prepare(req, prompt))
        except APIError as exc:
            if len(prompts) == 1 or not (exc.param == "prompt" or exc.code in PROMPT_CODES):
                raise
            raise APIError(
                exc.status, f"prompt {index}: {exc.message}", param=exc.param, code=exc.code
            ) from exc
    return prepared


async def merge_streams(
    streams: Sequence[AsyncIterator[T]],
) -> AsyncGenerator[tuple[int, T], None]:
    """The items of every stream as they come, each with its stream's index (items ready
    together in index order). Leaving early (or an error from one stream) closes them all."""
    pending: dict[asyncio.Future[T], int] = {}

    def arm(index: int) -> None:
        pending[asyncio.ensure_future(anext(streams[index]))] = index

    try:
        for index in range(len(streams)):
            arm(index)
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                index = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                arm(index)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]


async def collect_all(
    is_disconnected: Callable[[], Any], streams: Sequence[AsyncIterator[RequestOutput]]
) -> list[RequestOutput] | None:
    """Each stream's deltas folded into its whole output (:func:`merge_delta`), in stream
    order; None when the client disconnected first (every request is aborted). Exceptions of
    a stream (the engine died) propagate, the others aborted."""

    async def join() -> list[RequestOutput]:
        acc: dict[str, RequestOutput] = {}
        last: dict[int, RequestOutput] = {}
        async for index, out in merge_streams(streams):
            last[index] = merge_delta(acc, out)
        return [last[i] for i in range(len(streams))]

    task = asyncio.ensure_future(join())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await is_disconnected():
                return None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for stream in streams:  # never started, or already closed: a no-op
            await stream.aclose()  # type: ignore[attr-defined]


def summed_usage(finals: Sequence[RequestOutput]) -> p.Usage:
    """The usage of several prompts' outputs: prompt, completion and cached tokens summed."""
    return p.make_usage(
        sum(out.num_prompt_tokens for out in finals),
        sum(len(c.token_ids) for out in finals for c in out.outputs),
        sum(out.num_cached_tokens for out in finals),
    )


def choice_index(prompt_index: int, prepared: Prepared, index: int) -> int:
    """The response index of choice ``index`` of prompt ``prompt_index``."""
    return prompt_index * prepared.params.n + index


def batch_completion_response(
    finals: Sequence[RequestOutput],
    prepared: Sequence[Prepared],
    request_id: str,
    model: str,
    decode: Callable[[int], str],
) -> p.Completion:
    """The whole completions response of several finished prompts (choices by index)."""
    choices = []
    for k, (out, prep) in enumerate(zip(finals, prepared, strict=True)):
        for c in out.outputs:
            choice = completion_choice(out, c, prep, decode, with_prompt=True)
            choices.append(choice.model_copy(update={"index": choice_index(k, prep, c.index)}))
    choices.sort(key=lambda c: c.index)
    return p.Completion(
        id=request_id, created=p.now_s(), model=model, choices=choices, usage=summed_usage(finals)
    )
