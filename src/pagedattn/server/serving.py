"""Turn OpenAI requests into engine requests and engine outputs into OpenAI responses.

Request rules (each violation is a 400 with an OpenAI error body, before the engine sees it):

- ``n`` in 1..128 choices (forked from one prefill); completions' ``best_of`` >= ``n`` (the ``n``
  with the highest cumulative logprob), not streamed when ``best_of > n`` (as OpenAI).
- completions ``logprobs: N`` (0..20) and ``echo`` (the prompt's text, and with ``logprobs``
  its tokens' logprobs, the first null, before the generated ones); chat ``logprobs: true`` with
  ``top_logprobs`` 0..20 (``top_logprobs`` needs ``logprobs``).
- ``max_tokens`` / ``max_completion_tokens`` must be >= 1, or >= 0 with ``echo`` (then only the
  prompt comes back). Absent: completions generate 16 tokens (OpenAI's
  default), chat completions as many as fit (the model context left after the prompt, at most
  ``default_max_tokens``), both then shrunk to what the KV pool can hold.
- ``logit_bias`` keys and ``stop_token_ids`` must be ids inside the tokenizer's vocabulary.
- prompt + max_tokens must fit ``max_model_len`` (code ``context_length_exceeded``), and the
  request's K/V at its largest must fit the whole page pool (code ``cache_capacity_exceeded``).
- sampling values out of range (temperature < 0, top_p outside (0, 1], negative seed, empty
  stop string...) are refused by :class:`SamplingParams`, whose message names the field.
- unknown fields and fields that would change the output but are not served are refused
  (:mod:`pagedattn.server.request_fields`); chat template fields:
  :mod:`pagedattn.server.chat_prompt`; structured output: :mod:`pagedattn.server.structured`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import REJECTIONS, RequestOutput
from pagedattn.sampling_params import SamplingParams
from pagedattn.server import protocol as p
from pagedattn.server.chat_prompt import chat_prompt_ids
from pagedattn.server.engine_client import EngineClient
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError, error_body, value_error
from pagedattn.server.request_fields import check_request_fields
from pagedattn.server.responses import chat_response, completion_response
from pagedattn.server.sse import failure_of, sse_events
from pagedattn.server.structured import StructuredOutput
from pagedattn.server.tools import ToolPlan, ToolPlanner

DISCONNECT_POLL_S = 0.25
MAX_CHOICES = 128  # most n / best_of per request (OpenAI's limit on n)


@dataclass(frozen=True)
class Prepared:
    """A validated request: prompt ids, sampling parameters, and how to answer.

    Attributes:
        echo_text: the prompt's text to put before each choice's text (completions ``echo``),
            else None.
        num_top: alternatives per token in the response's logprobs; None = no logprobs.
        tools: how a chat request calls tools (:mod:`pagedattn.server.tools`), else None.
    """

    prompt_token_ids: list[int]
    params: SamplingParams
    echo_text: str | None = None
    num_top: int | None = None
    tools: ToolPlan | None = None


class OpenAIServing:
    """The completion and chat handlers of one server.

    Args:
        async_engine: the engine loop (an :class:`EngineClient`).
        model_name: the served model name (requests naming another model get a 404).
        default_max_tokens: cap on the chat default ``max_tokens`` when the context is unbounded
            or longer.
        aliases: more names clients may pass as ``model`` (``--served-model-name`` repeated);
            a response names the model as the request did.
    """

    def __init__(
        self,
        async_engine: EngineClient,
        model_name: str,
        default_max_tokens: int = 1024,
        aliases: Sequence[str] = (),
    ) -> None:
        self.async_engine = async_engine
        self.engine: LLMEngine = async_engine.engine
        self.model_name = model_name
        self.model_names: tuple[str, ...] = (model_name, *(a for a in aliases if a != model_name))
        self.structured = StructuredOutput(
            self.engine.tokenizer, self.engine.model_config.vocab_size
        )
        self.tool_planner = ToolPlanner(
            self.engine.tokenizer,
            lambda fmt: self.structured.special_tokens((fmt.open_tag, fmt.close_tag)),
        )
        self.default_max_tokens = default_max_tokens
        self.max_model_len: int | None = self.engine.scheduler.max_model_len

    # ---- validation ------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        """Raises APIError 404 when ``model`` names another model (None = the served one)."""
        if model is not None and model not in self.model_names:
            names = ", ".join(f"'{n}'" for n in self.model_names)
            raise APIError(
                404,
                f"The model '{model}' does not exist; this server serves {names}.",
                param="model",
                code="model_not_found",
            )

    def _fits_pool(self, num_prompt: int, max_tokens: int, copies: int = 1) -> bool:
        sched = self.engine.scheduler
        return sched.max_pages_per_seq(num_prompt, max_tokens, copies) <= sched.cache.num_pages

    def resolve_max_tokens(
        self, req: p.SamplingFields, num_prompt: int, default: int, least: int = 1
    ) -> int:
        """The request's max_tokens under the module's rules (``least``: the smallest allowed
        value, 0 under ``echo``). Raises APIError (400)."""
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else None
        asked = asked if asked is not None else req.max_tokens
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        copies = _copies(req)
        if asked is not None and asked < least:
            raise APIError(400, f"{field} must be at least {least}, got {asked}", param=field)
        limit = self.max_model_len
        room = None if limit is None else limit - num_prompt
        if room is not None and room < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens; the prompt has "
                f"{num_prompt} tokens, which leaves no room to generate.",
                param="messages" if isinstance(req, p.ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        if asked is None:
            want = default if room is None else min(default, room)
            if not self._fits_pool(num_prompt, 1, copies):
                raise self._capacity_error(num_prompt, 1, copies)
            lo, hi = 1, want  # largest max_tokens that fits the pool (monotone)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if self._fits_pool(num_prompt, mid, copies) else (lo, mid - 1)
            return lo
        if room is not None and asked > room:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt + asked} tokens ({num_prompt} in the prompt, {asked} for the "
                "completion). Please reduce the prompt or the completion length.",
                param=field,
                code="context_length_exceeded",
            )
        if not self._fits_pool(num_prompt, asked, copies):
            raise self._capacity_error(num_prompt, asked, copies)
        return asked

    def _capacity_error(self, num_prompt: int, max_tokens: int, copies: int) -> APIError:
        sched = self.engine.scheduler
        need = sched.max_pages_per_seq(num_prompt, max_tokens, copies)
        return APIError(
            400,
            f"The request needs {need} KV pages ({num_prompt} prompt tokens + {max_tokens} "
            f"completion tokens x {copies} sequences, {sched.cache_config.page_size} tokens "
            "per page); the KV pool "
            f"holds {sched.cache.num_pages} pages.",
            param="max_tokens",
            code="cache_capacity_exceeded",
        )

    def _check_common(self, req: p.SamplingFields) -> None:
        self.check_model(req.model)
        check_request_fields(req)  # type: ignore[arg-type]
        best_of = getattr(req, "best_of", None)
        for name, value in (("n", req.n), ("best_of", best_of)):
            if value is not None and not 1 <= value <= MAX_CHOICES:
                raise APIError(400, f"{name}: expected 1..{MAX_CHOICES}, got {value}", param=name)
        if req.stream and best_of is not None and best_of > req.n:
            raise APIError(400, "best_of: cannot stream when best_of > n", param="best_of")

    def _params(self, req: p.SamplingFields, max_tokens: int, **extra: Any) -> SamplingParams:
        try:
            bias = None
            if req.logit_bias is not None:
                try:
                    bias = {int(k): v for k, v in req.logit_bias.items()}
                except ValueError:
                    raise ValueError("logit_bias: keys must be token ids") from None
            params = SamplingParams(
                n=req.n,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                min_p=req.min_p,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty,
                logit_bias=bias,
                seed=req.seed,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                stop=_stops(req.stop),
                stop_token_ids=tuple(req.stop_token_ids or ()),
                include_stop_str_in_output=req.include_stop_str_in_output,
                ignore_eos=req.ignore_eos,
                skip_special_tokens=req.skip_special_tokens,
                **extra,
            )
            params.check_vocab(self.engine.vocab_size)
            return params
        except ValueError as exc:
            raise value_error(exc) from exc

    def prepare_completion(self, req: p.CompletionRequest) -> Prepared:
        """Validate a completions request. Raises APIError."""
        self._check_common(req)
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(
                    400, f"prompt: one prompt per request, got {len(prompt)}", param="prompt"
                )
            prompt = prompt[0]
        try:
            ids = self.engine.encode(prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from exc
        max_tokens = self.resolve_max_tokens(req, len(ids), 16, least=0 if req.echo else 1)
        params = self._params(
            req,
            max_tokens,
            best_of=req.best_of,
            logprobs=req.logprobs,
            prompt_logprobs=req.logprobs if req.echo else None,
        )
        echo_text = None
        if req.echo:
            echo_text = prompt if isinstance(prompt, str) else self.engine.tokenizer.decode(ids)
        return Prepared(ids, params, echo_text, req.logprobs)

    def prepare_chat(self, req: p.ChatCompletionRequest) -> Prepared:
        """Validate a chat request and render it with the chat template. Raises APIError."""
        self._check_common(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
            raise APIError(
                400, f"top_logprobs: expected 0..20, got {req.top_logprobs}", param="top_logprobs"
            )
        num_top = (req.top_logprobs or 0) if req.logprobs else None
        tools = self.tool_planner.plan(req)
        ids = chat_prompt_ids(req, self.engine.tokenizer)
        max_tokens = self.resolve_max_tokens(req, len(ids), self.default_max_tokens)
        params = self._params(req, max_tokens, logprobs=num_top)
        return Prepared(ids, params, None, num_top, tools)

    # ---- responses -------------------------------------------------------------------------
    async def respond(
        self, raw: Request, req: p.CompletionRequest | p.ChatCompletionRequest
    ) -> JSONResponse | StreamingResponse:
        """Run a validated request and answer it (JSON, or SSE when ``stream``)."""
        arrival_time = time.monotonic()  # TTFT and e2e latency include all queueing
        chat = isinstance(req, p.ChatCompletionRequest)
        prepare: Any = self.prepare_chat if chat else self.prepare_completion
        # tokenising, template rendering and grammar compilation of a long prompt must not
        # block the event loop
        try:
            prepared: Prepared = await run_in_threadpool(prepare, req)
            tool_spec = prepared.tools.spec if prepared.tools is not None else None
            processors = await run_in_threadpool(self.structured.processors, req, tool_spec)
        except APIError as exc:
            metrics = self.async_engine.metrics
            if exc.code in REJECTIONS and metrics is not None:
                metrics.count_rejection(exc.code)
            raise
        if processors:
            params = prepared.params
            params = dataclasses.replace(
                params, logits_processors=(*params.logits_processors, *processors)
            )
            prepared = dataclasses.replace(prepared, params=params)
        model_name = req.model or self.model_name
        self.async_engine.start()
        if not self.async_engine.is_running:
            raise _unavailable(EngineDeadError(self.async_engine.death or "engine not running"))
        request_id = p.random_id("chatcmpl-" if chat else "cmpl-")
        outputs = self.async_engine.generate(
            prepared.prompt_token_ids, prepared.params, request_id, arrival_time
        )
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            body = sse_events(
                outputs, request_id, model_name, chat, usage, prepared, self.token_text
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
        response = build(final, request_id, model_name, prepared, self.token_text)
        return JSONResponse(p.dump(response))

    def token_text(self, token_id: int) -> str:
        """One token's text (special tokens included)."""
        return str(self.engine.tokenizer.decode([token_id], skip_special_tokens=False))


def _copies(req: p.SamplingFields) -> int:
    best_of = getattr(req, "best_of", None)
    return max(req.n, best_of or 0)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


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
