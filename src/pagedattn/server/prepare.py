"""Turn a validated OpenAI request into what the engine runs (:class:`Prepared`).

Request rules (each violation is a 400 with an OpenAI error body, before the engine sees it):

- ``n`` in 1..128 choices (forked from one prefill); completions' ``best_of`` >= ``n`` (the ``n``
  with the highest cumulative logprob), not streamed when ``best_of > n`` (as OpenAI);
  ``stream_options`` only with ``stream: true`` (as OpenAI).
- completions ``logprobs: N`` (0..20) and ``echo`` (the prompt's text, and with ``logprobs``
  its tokens' logprobs, the first null, before the generated ones); chat ``logprobs: true`` with
  ``top_logprobs`` 0..20 (``top_logprobs`` needs ``logprobs``); ``prompt_logprobs`` 0..20, not
  streamed (:mod:`pagedattn.server.prompt_logprobs`); chat ``echo`` puts the last message's
  content before each reply when that message is the assistant's (vLLM's rule), else nothing.
- prompt size, ``max_tokens``, context length and KV pool: :mod:`pagedattn.server.limits`.
- ``logit_bias`` keys and ``stop_token_ids`` must be ids inside the tokenizer's vocabulary.
- sampling values out of range (temperature < 0, top_p outside (0, 1], negative seed, empty
  stop string...) are refused by :class:`SamplingParams`, whose message names the field.
- unknown fields and fields that would change the output but are not served are refused
  (:mod:`pagedattn.server.request_fields`); chat template fields:
  :mod:`pagedattn.server.chat_prompt`; structured output: :mod:`pagedattn.server.structured`.
"""

from __future__ import annotations

from typing import Any

import pagedattn.server.protocol as p
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.batch_prompts import prompts_of
from pagedattn.server.chat_prompt import chat_prompt_ids
from pagedattn.server.errors import APIError, value_error
from pagedattn.server.limits import RequestLimits
from pagedattn.server.prepared import Prepared
from pagedattn.server.request_fields import check_request_fields
from pagedattn.server.served_model import ServedModel
from pagedattn.server.tools import ToolPlanner

MAX_CHOICES = 128  # most n / best_of per request (OpenAI's limit on n)


class RequestPreparer:
    """Validates requests for one engine and builds their :class:`Prepared` form (blocking:
    tokenising and template rendering; run it off the event loop).

    Args:
        engine: the served engine (read only: its tokenizer and vocabulary).
        served: the served model's names.
        default_max_tokens: cap on the chat default ``max_tokens``.
        tool_planner: plans a chat request's tool calls (:mod:`pagedattn.server.tools`).
        max_seqs_per_request: see :class:`RequestLimits`.
    """

    def __init__(
        self,
        engine: LLMEngine,
        served: ServedModel,
        default_max_tokens: int,
        tool_planner: ToolPlanner,
        max_seqs_per_request: int | None = None,
    ) -> None:
        self.engine = engine
        self.served = served
        self.limits = RequestLimits(engine, max_seqs_per_request)
        self.default_max_tokens = default_max_tokens
        self.tool_planner = tool_planner

    def check_common(self, req: p.SamplingFields) -> None:
        """The checks both routes share. Raises APIError."""
        self.served.check_model(req.model)
        check_request_fields(req)  # type: ignore[arg-type]
        best_of = getattr(req, "best_of", None)
        for name, value in (("n", req.n), ("best_of", best_of)):
            if value is not None and not 1 <= value <= MAX_CHOICES:
                raise APIError(400, f"{name}: expected 1..{MAX_CHOICES}, got {value}", param=name)
        num_prompts = len(prompts_of(req.prompt)) if isinstance(req, p.CompletionRequest) else 1
        self.limits.check_sequences(req, num_prompts)
        if req.stream and best_of is not None and best_of > req.n:
            raise APIError(400, "best_of: cannot stream when best_of > n", param="best_of")
        if req.prompt_logprobs is not None:
            if not 0 <= req.prompt_logprobs <= 20:
                raise APIError(
                    400,
                    f"prompt_logprobs: expected 0..20, got {req.prompt_logprobs}",
                    param="prompt_logprobs",
                )
            if req.stream:
                raise APIError(
                    400, "prompt_logprobs: not supported when streaming", param="prompt_logprobs"
                )
        if req.stream_options is not None and not req.stream:
            raise APIError(
                400,
                "stream_options: only allowed when stream is true",
                param="stream_options",
            )

    def params(self, req: p.SamplingFields, max_tokens: int, **extra: Any) -> SamplingParams:
        """The request's sampling parameters. Raises APIError (400, naming the field)."""
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
                speculative_decoding="auto" if req.speculative else "off",
                **extra,
            )
            params.check_vocab(self.engine.vocab_size)
            return params
        except ValueError as exc:
            raise value_error(exc) from exc

    def completion(
        self, req: p.CompletionRequest, prompt: str | list[int] | None = None
    ) -> Prepared:
        """Validate a completions request for one prompt: ``prompt`` (one of the request's
        several, :mod:`pagedattn.server.batch_prompts`), else the request's only one. Raises
        APIError."""
        self.check_common(req)
        if prompt is None:
            prompts = prompts_of(req.prompt)
            if len(prompts) != 1:
                raise APIError(
                    400, f"prompt: expected one prompt, got {len(prompts)}", param="prompt"
                )
            prompt = prompts[0]
        if isinstance(prompt, str):
            self.limits.check_prompt_bytes(prompt, "prompt")
        try:
            ids = self.engine.encode(prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from exc
        least = 0 if req.echo else 1
        max_tokens = self.limits.resolve_max_tokens(req, len(ids), 16, least=least)
        params = self.params(
            req,
            max_tokens,
            best_of=req.best_of,
            logprobs=req.logprobs,
            prompt_logprobs=_most(req.logprobs if req.echo else None, req.prompt_logprobs),
        )
        echo_text = None
        if req.echo:
            echo_text = prompt if isinstance(prompt, str) else self.engine.tokenizer.decode(ids)
        return Prepared(ids, params, echo_text, req.logprobs, prompt_logprobs=req.prompt_logprobs)

    def chat(self, req: p.ChatCompletionRequest) -> Prepared:
        """Validate a chat request and render it with the chat template. Raises APIError."""
        self.check_common(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
            raise APIError(
                400, f"top_logprobs: expected 0..20, got {req.top_logprobs}", param="top_logprobs"
            )
        num_top = (req.top_logprobs or 0) if req.logprobs else None
        tools = self.tool_planner.plan(req)

        def check(text: str) -> None:
            self.limits.check_prompt_bytes(text, "messages")

        ids = chat_prompt_ids(req, self.engine.tokenizer, check)
        max_tokens = self.limits.resolve_max_tokens(req, len(ids), self.default_max_tokens)
        params = self.params(req, max_tokens, logprobs=num_top, prompt_logprobs=req.prompt_logprobs)
        last = req.messages[-1]
        echo_text = last.text() if req.echo and last.role == "assistant" else None
        return Prepared(ids, params, echo_text, num_top, tools, req.prompt_logprobs)


def _most(a: int | None, b: int | None) -> int | None:
    """The larger of two optional counts (None when both are None)."""
    return b if a is None else a if b is None else max(a, b)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)
