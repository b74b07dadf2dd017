"""Server-sent events for streamed completions and chat completions (OpenAI's chunk format:
``data: <json>`` lines, a final ``data: [DONE]``). A request with ``n`` choices interleaves
chunks of every choice, each carrying its ``index``; chunks carry their tokens' logprobs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import (
    FINISH_ABORT,
    FINISH_ERROR,
    REJECTIONS,
    CompletionOutput,
    RequestOutput,
)
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError, error_body, unexpected_error_body
from pagedattn.server.prepared import Prepared
from pagedattn.server.responses import (
    chat_choice_logprobs,
    completion_choice,
    openai_finish_reason,
    usage_of,
)
from pagedattn.server.tool_replies import ToolStream


def failure_of(out: RequestOutput) -> APIError | None:
    """The error response of a finished request that did not complete, else None: a rejection
    is a 400 naming its code, a request the engine failed a 500, one aborted by shutdown a
    503 (never a "stop")."""
    reason = out.outputs[0].finish_reason if out.outputs else None
    if reason in REJECTIONS:
        return APIError(400, out.error or str(reason), code=reason)
    if reason == FINISH_ERROR or (reason is None and out.error is not None):
        # the first line: a parser's state dump after it is for the log, not the client
        message = (out.error or "").split("\n", 1)[0].strip() or "the engine failed this request"
        return APIError(500, message, code="engine_error")
    if reason == FINISH_ABORT:
        return APIError(503, "the request was aborted: the server is shutting down")
    return None


def _error_event(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return _event(error_body(exc.status, exc.message, exc.param, exc.code))
    if isinstance(exc, EngineDeadError):
        return _event(error_body(503, str(exc), code="engine_unavailable"))
    return _event(unexpected_error_body(exc))


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


_MARK = "\x00content"  # no text JSON-encodes to its escaped form: a safe place holder


class ContentEvents:
    """The event of a chat delta that carries text alone (no logprobs, no finish), per token
    the hot path of a stream: the bytes of dumping its :class:`ChatCompletionChunk` (the
    model is dumped once per choice index, the text spliced in), without building and
    dumping the model each token."""

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self.request_id, self.created, self.model = request_id, created, model
        self._parts: dict[int, tuple[str, str]] = {}

    def __call__(self, index: int, text: str) -> str:
        parts = self._parts.get(index)
        if parts is None:
            choice = p.ChatChunkChoice(index=index, delta=p.ChatDelta(content=_MARK))
            chunk = p.ChatCompletionChunk(
                id=self.request_id, created=self.created, model=self.model, choices=[choice]
            )
            data = p.dump(chunk)
            data["choices"][0]["delta"] = {"content": _MARK}
            head, tail = _event(data).split(json.dumps(_MARK))
            parts = self._parts[index] = (head, tail)
        return parts[0] + json.dumps(text) + parts[1]


async def sse_events(
    outputs: AsyncIterator[RequestOutput],
    request_id: str,
    model: str,
    chat: bool,
    usage: bool,
    prepared: Prepared,
    decode: Callable[[int], str],
    on_unexpected: Callable[[BaseException], None] | None = None,
    continuous: bool = False,
) -> AsyncIterator[str]:
    """Server-sent events: per choice a chunk per delta that has text or logprobs (under
    completions ``echo`` the prompt first), its finish chunk, an optional usage chunk, then
    ``data: [DONE]``. Cancellation (client gone) aborts the request via ``outputs``.

    ``continuous`` (vLLM's ``stream_options.continuous_usage_stats``) puts on every chunk the
    usage so far of its choice (the prompt's tokens and the tokens that choice generated).
    Asked for token ids (``prepared.token_ids``), every chunk carries its delta's token ids
    and the first chunk of each choice the prompt's (vLLM's placement).

    A request that fails (rejected, failed by the engine, aborted by shutdown, the engine
    thread died) ends the stream with a final ``data: {"error": {...}}`` event (OpenAI's
    error body) instead of a finish chunk or ``[DONE]``; ``on_unexpected`` hears of every
    exception that is neither an :class:`APIError` nor the engine's death."""
    created = p.now_s()
    offsets: dict[int, int] = {}  # completions text_offset so far, per choice
    generated: dict[int, int] = {}  # tokens generated so far, per choice
    num_prompt = len(prepared.prompt_token_ids)
    cached = 0
    prompt_sent: set[int] = set()  # choices whose prompt token ids went out

    def usage_so_far(index: int) -> p.Usage | None:
        return p.make_usage(num_prompt, generated.get(index, 0), cached) if continuous else None

    def completion(out: RequestOutput, c: CompletionOutput, prompt: bool, finish: bool) -> str:
        choice = completion_choice(
            out,
            c,
            prepared,
            decode,
            with_prompt=prompt,
            initial_offset=offsets.get(c.index, 0),
            finish=finish,
            prompt_ids=c.index not in prompt_sent,
        )
        prompt_sent.add(c.index)
        if choice.logprobs is not None:
            offsets[c.index] = offsets.get(c.index, 0) + sum(map(len, choice.logprobs.tokens))
        body = p.Completion(
            id=request_id,
            created=created,
            model=model,
            choices=[choice],
            usage=usage_so_far(c.index),
        )
        return _event(p.dump(body))

    content_event = ContentEvents(request_id, created, model)
    fast = not (continuous or prepared.token_ids)  # content deltas carry text alone
    plan = prepared.tools
    tool_streams = {} if plan is None else {i: ToolStream(plan) for i in range(prepared.params.n)}

    def chat_chunk(
        index: int,
        delta: p.ChatDelta,
        c: CompletionOutput | None,
        fin: bool,
        reason: p.FinishReason | None = None,
        token_ids: list[int] | None = None,
    ) -> str:
        logprobs = None if c is None or fin else chat_choice_logprobs(c, prepared, decode)
        if reason is None:
            reason = openai_finish_reason(c) if fin and c is not None else None
        choice = p.ChatChunkChoice(
            index=index,
            delta=delta,
            logprobs=logprobs,
            finish_reason=reason,
            token_ids=token_ids if prepared.token_ids else None,
        )
        prompt_ids = None
        if prepared.token_ids and index not in prompt_sent:
            prompt_sent.add(index)
            prompt_ids = list(prepared.prompt_token_ids)
        chunk = p.ChatCompletionChunk(
            id=request_id,
            created=created,
            model=model,
            choices=[choice],
            usage=usage_so_far(index),
            prompt_token_ids=prompt_ids,
        )
        data = p.dump(chunk)
        # like OpenAI, a delta lists only the fields it sets
        data["choices"][0]["delta"] = {
            k: v for k, v in data["choices"][0]["delta"].items() if v is not None
        }
        return _event(data)

    try:
        if chat:
            for i in range(prepared.params.n):
                yield chat_chunk(i, p.ChatDelta(role="assistant", content=""), None, False)
                if prepared.echo_text:  # chat echo: the assistant's last message first
                    yield chat_chunk(i, p.ChatDelta(content=prepared.echo_text), None, False)
        num_generated = 0
        try:
            first = True
            async for out in outputs:
                failure = failure_of(out) if out.finished else None
                if failure is not None:
                    raise failure
                cached = out.num_cached_tokens
                if first and not chat and prepared.echo_text is not None:
                    for i in range(prepared.params.n):
                        yield completion(out, CompletionOutput(index=i), True, False)
                first = False
                for c in out.outputs:
                    num_generated += len(c.token_ids)
                    generated[c.index] = generated.get(c.index, 0) + len(c.token_ids)
                    has_logprobs = prepared.num_top is not None and c.token_ids
                    stream = tool_streams.get(c.index)
                    text = c.text if stream is None else stream.feed(c.text)
                    ids = list(c.token_ids)
                    if text or has_logprobs or (prepared.token_ids and ids):
                        if chat and prepared.num_top is None and fast:
                            yield content_event(c.index, text)
                        elif chat:
                            delta = p.ChatDelta(content=text)
                            yield chat_chunk(c.index, delta, c, False, None, ids)
                        else:
                            yield completion(out, c, False, False)
                    if c.finish_reason is not None:
                        if chat and stream is not None:
                            rest, calls, reason = stream.finish(c)
                            if rest or calls:
                                delta = p.ChatDelta(content=rest or None, tool_calls=calls or None)
                                yield chat_chunk(c.index, delta, None, False, None, [])
                            yield chat_chunk(c.index, p.ChatDelta(), c, True, reason, [])
                        elif chat:
                            yield chat_chunk(c.index, p.ChatDelta(), c, True, None, [])
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
        except Exception as exc:  # the final event carries the error: no truncated body
            expected = isinstance(exc, (APIError, EngineDeadError))
            if not expected and on_unexpected is not None:
                on_unexpected(exc)
            yield _error_event(exc)
            return
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
