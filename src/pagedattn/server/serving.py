"""Run a prepared request on the engine loop and answer it: one JSON response, or server-sent
events when ``stream`` is true (validation: :mod:`pagedattn.server.prepare`)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import REJECTIONS, RequestOutput, merge_delta
from pagedattn.server.batch_prompts import (
    batch_completion_response,
    collect_all,
    prepare_prompts,
)
from pagedattn.server.batch_sse import batch_sse_events
from pagedattn.server.constraint_check import check_satisfiable
from pagedattn.server.engine_client import EngineClient
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError, error_body
from pagedattn.server.json_body import json_response
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.prepare import RequestPreparer
from pagedattn.server.prepared import Prepared
from pagedattn.server.responses import chat_response, completion_response
from pagedattn.server.served_model import ServedModel
from pagedattn.server.sse import failure_of, sse_events
from pagedattn.server.structured import StructuredOutput
from pagedattn.server.tools import ToolPlanner

DISCONNECT_POLL_S = 0.25


class OpenAIServing:
    """The completion and chat handlers of one server.

    Args:
        async_engine: the engine loop (an :class:`EngineClient`).
        spec: the served model (tokenizer, vocabulary, limits) requests are validated against.
        model_name: the served model name (requests naming another model get a 404).
        default_max_tokens: cap on the chat default ``max_tokens`` when the context is unbounded
            or longer.
        aliases: more names clients may pass as ``model`` (``--served-model-name`` repeated);
            a response names the model as the request did.
        max_logprobs: the most logprobs per position a request may ask for; -1 = the whole
            vocabulary (vLLM's ``--max-logprobs``).
        max_seqs_per_request: most prompts x ``n`` per request (:mod:`pagedattn.server.limits`).
    """

    def __init__(
        self,
        async_engine: EngineClient,
        spec: ModelSpec,
        model_name: str,
        default_max_tokens: int = 1024,
        aliases: Sequence[str] = (),
        max_logprobs: int = 20,
        max_seqs_per_request: int | None = None,
    ) -> None:
        self.async_engine = async_engine
        self.spec = spec
        self.served = ServedModel.of(model_name, aliases, spec.max_model_len, spec.tokenizer)
        self.structured = StructuredOutput(spec.tokenizer, spec.logits_size)
        tool_planner = ToolPlanner(
            spec.tokenizer,
            lambda fmt: self.structured.special_tokens((fmt.open_tag, fmt.close_tag)),
        )
        self.prepare = RequestPreparer(
            spec,
            self.served,
            default_max_tokens,
            tool_planner,
            max_logprobs,
            max_seqs_per_request,
        )

    async def respond(
        self, raw: Request, req: p.CompletionRequest | p.ChatCompletionRequest
    ) -> Response:
        """Run a validated request and answer it (JSON, or SSE when ``stream``)."""
        arrival_time = time.monotonic()  # TTFT and e2e latency include all queueing
        chat = isinstance(req, p.ChatCompletionRequest)
        # tokenising, template rendering and grammar compilation of a long prompt must not
        # block the event loop (tokenising releases the GIL: it stalls no other thread)
        try:
            if isinstance(req, p.ChatCompletionRequest):
                batch = [await run_in_threadpool(self.prepare.chat, req)]
            else:
                batch = await run_in_threadpool(prepare_prompts, req, self.prepare.completion)
            batch = [await run_in_threadpool(self.constrained, req, pr) for pr in batch]
        except APIError as exc:
            metrics = self.async_engine.metrics
            if exc.code in REJECTIONS and metrics is not None:
                metrics.count_rejection(exc.code)
            raise
        model_name = req.model or self.served.name
        self.async_engine.start()
        if not self.async_engine.is_running:
            raise _unavailable(EngineDeadError(self.async_engine.death or "engine not running"))
        prefix = "chatcmpl-" if chat else "cmpl-"
        request_id = p.random_id(prefix)  # the engine's: unique whatever the client sends
        response_id = request_id if req.request_id is None else prefix + req.request_id
        if len(batch) > 1:
            return await self._respond_batch(
                raw, req, batch, (request_id, response_id), model_name, arrival_time
            )
        prepared = batch[0]
        outputs = self.async_engine.generate(
            prepared.prompt_token_ids, prepared.params, request_id, arrival_time
        )
        if req.stream:
            usage, continuous = _usage_options(req)
            metrics = self.async_engine.metrics
            body = sse_events(
                outputs,
                response_id,
                model_name,
                chat,
                usage,
                prepared,
                self.token_text,
                on_unexpected=None if metrics is None else metrics.count_unexpected,
                continuous=continuous,
            )
            return StreamingResponse(body, media_type="text/event-stream")
        try:
            final = await _collect(raw, outputs)
        except EngineDeadError as exc:
            raise _unavailable(exc) from exc
        if final is None:  # the client went away; the request was aborted
            return JSONResponse(error_body(499, "client disconnected"), status_code=499)
        _raise_failure(final)
        build = chat_response if chat else completion_response

        def reply() -> Response:
            response = build(final, response_id, model_name, prepared, self.token_text)
            return json_response(p.dump(response))

        # a reply with (prompt) logprobs of a long prompt is megabytes of JSON: built and
        # serialised on a worker thread, in pieces that never hold the GIL for long, so the
        # event loop (/health, other streams) and the engine thread run on
        return await run_in_threadpool(reply)

    def constrained(
        self, req: p.CompletionRequest | p.ChatCompletionRequest, prepared: Prepared
    ) -> Prepared:
        """``prepared`` with the logits processors of its structured output (a fresh one per
        prompt: a processor holds its request's grammar state). Blocking. Raises APIError."""
        tool_spec = prepared.tools.spec if prepared.tools is not None else None
        processors = self.structured.processors(req, tool_spec)
        spec = self.spec
        check_satisfiable(
            prepared.params,
            processors,
            spec.vocab_size,
            spec.logits_size,
            spec.eos_token_ids,
        )
        if not processors:
            return prepared
        params = prepared.params
        params = dataclasses.replace(
            params, logits_processors=(*params.logits_processors, *processors)
        )
        return dataclasses.replace(prepared, params=params)

    async def _respond_batch(
        self,
        raw: Request,
        req: p.CompletionRequest | p.ChatCompletionRequest,
        batch: list[Prepared],
        ids: tuple[str, str],
        model_name: str,
        arrival_time: float,
    ) -> Response:
        """Answer a completions request with several prompts
        (:mod:`pagedattn.server.batch_prompts`): one engine request per prompt. ``ids``: the
        engine's request id and the response's."""
        request_id, response_id = ids
        streams = [
            self.async_engine.generate(
                pr.prompt_token_ids, pr.params, f"{request_id}-{k}", arrival_time
            )
            for k, pr in enumerate(batch)
        ]
        if req.stream:
            usage, continuous = _usage_options(req)
            metrics = self.async_engine.metrics
            body = batch_sse_events(
                streams,
                batch,
                response_id,
                model_name,
                usage,
                self.token_text,
                on_unexpected=None if metrics is None else metrics.count_unexpected,
                continuous=continuous,
            )
            return StreamingResponse(body, media_type="text/event-stream")
        try:
            finals = await collect_all(raw.is_disconnected, streams)
        except EngineDeadError as exc:
            raise _unavailable(exc) from exc
        if finals is None:  # the client went away; every prompt's request was aborted
            return JSONResponse(error_body(499, "client disconnected"), status_code=499)
        for final in finals:
            _raise_failure(final)

        def reply() -> Response:
            response = batch_completion_response(
                finals, batch, response_id, model_name, self.token_text
            )
            return json_response(p.dump(response))

        return await run_in_threadpool(reply)  # off the event loop, as a single reply

    def token_text(self, token_id: int) -> str:
        """One token's text (special tokens included)."""
        return str(self.spec.tokenizer.decode([token_id], skip_special_tokens=False))


def _usage_options(req: p.SamplingFields) -> tuple[bool, bool]:
    """(a final usage chunk, usage on every chunk): ``stream_options.include_usage`` and, with
    it, vLLM's ``continuous_usage_stats`` (vLLM's rule: alone it adds nothing)."""
    options = req.stream_options
    usage = options is not None and options.include_usage
    return usage, usage and options is not None and options.continuous_usage_stats


def _unavailable(exc: EngineDeadError) -> APIError:
    return APIError(503, str(exc), code="engine_unavailable")


def _raise_failure(out: RequestOutput) -> None:
    """Raise the error response of a request that did not complete (see :func:`failure_of`)."""
    failure = failure_of(out)
    if failure is not None:
        raise failure


async def _collect(raw: Request, outputs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    """Fold every delta into the whole output (:func:`merge_delta`); None when the client
    disconnected first (the request is aborted)."""

    async def join() -> RequestOutput | None:
        acc: dict[str, RequestOutput] = {}
        last = None
        async for out in outputs:
            last = merge_delta(acc, out)
        return last

    task = asyncio.ensure_future(join())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await raw.is_disconnected():
                return None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await outputs.aclose()  # type: ignore[attr-defined]
