"""Turn a validated OpenAI request into what the engine runs (:class:`Prepared`).

Request rules (each violation is a 400 with an OpenAI error body, before the engine sees it):

- ``n`` in 1..128 choices (child requests sharing the prompt's pages); completions'
  ``best_of`` >= ``n`` (the ``n`` with the highest cumulative logprob), not streamed when
  ``best_of > n`` (as OpenAI);
  ``stream_options`` only with ``stream: true`` (as OpenAI).
- completions ``logprobs: N`` and ``echo`` (the prompt's text, and with ``logprobs`` its
  tokens' logprobs, the first null, before the generated ones); chat ``logprobs: true`` with
  ``top_logprobs`` (a non-zero ``top_logprobs`` needs ``logprobs``); ``prompt_logprobs``, not
  streamed (:mod:`pagedattn.server.prompt_logprobs`). Counts are at most ``max_logprobs``
  (vLLM's ``--max-logprobs``, default 20); ``-1`` for ``prompt_logprobs`` / ``top_logprobs``
  is the whole vocabulary (then ``max_logprobs`` must allow it, as in vLLM). Chat ``echo`` puts
  the last message's content before each reply when that message is the assistant's (vLLM's
  rule), else nothing.
- prompt size, ``max_tokens``, context length and KV pool: :mod:`pagedattn.server.limits`.
- ``logit_bias`` keys and ``stop_token_ids`` must be ids inside the tokenizer's vocabulary.
- sampling values out of range (temperature < 0, top_p outside (0, 1], empty stop string...)
  are refused by :class:`SamplingParams`, whose message names the field; ``seed`` is any
  int64 (a negative one is taken as its two's-complement unsigned value).
- vLLM's extra fields (``return_token_ids``, ``truncate_prompt_tokens``...):
  :mod:`pagedattn.server.vllm_request`.
- unknown fields and fields that would change the output but are not served are refused
  (:mod:`pagedattn.server.request_fields`); chat template fields:
  :mod:`pagedattn.server.chat_prompt`; structured output: :mod:`pagedattn.server.structured`.
"""

from __future__ import annotations

from typing import Any

import pagedattn.server.protocol as p
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.batch_prompts import prompts_of
from pagedattn.server.chat_prompt import chat_prompt_ids
from pagedattn.server.errors import APIError, value_error
from pagedattn.server.limits import RequestLimits
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.prepared import Prepared
from pagedattn.server.request_fields import check_request_fields
from pagedattn.server.served_model import ServedModel
from pagedattn.server.tools import ToolPlanner
from pagedattn.server.vllm_fields import bad_word_ids, check_vllm_fields, engine_seed, truncated

MAX_CHOICES = 128  # most n / best_of per request (OpenAI's limit on n)


class RequestPreparer:
    """Validates requests for one served model and builds their :class:`Prepared` form (blocking:
    tokenising and template rendering; run it off the event loop).

    Args:
        spec: the served model (its tokenizer, vocabulary and limits).
        served: the served model's names.
        default_max_tokens: cap on the chat default ``max_tokens``.
        tool_planner: plans a chat request's tool calls (:mod:`pagedattn.server.tools`).
        max_logprobs: the most logprobs per position a request may ask for; -1 = the whole
            vocabulary (vLLM's ``--max-logprobs``).
        max_seqs_per_request: see :class:`RequestLimits`.
    """

    def __init__(
        self,
        spec: ModelSpec,
        served: ServedModel,
        default_max_tokens: int,
        tool_planner: ToolPlanner,
        max_logprobs: int = 20,
        max_seqs_per_request: int | None = None,
    ) -> None:
        self.spec = spec
        self.served = served
        self.limits = RequestLimits(spec, max_seqs_per_request)
        self.default_max_tokens = default_max_tokens
        self.tool_planner = tool_planner
        vocab = spec.vocab_size
        self.max_logprobs = vocab if max_logprobs == -1 else min(max_logprobs, vocab)

    def num_logprobs(self, name: str, value: int | None, whole_vocab: bool = True) -> int | None:
        """A logprobs count as the engine takes it: ``-1`` (when ``whole_vocab``) is the
        vocabulary's size; more than ``max_logprobs`` is a 400 naming ``name``."""
        if value is None:
            return None
        count = self.spec.vocab_size if value == -1 and whole_vocab else value
        if count < 0:
            expected = "-1 (the whole vocabulary) or an int >= 0" if whole_vocab else "an int >= 0"
            raise APIError(400, f"{name}: expected {expected}, got {value}", param=name)
        if count > self.max_logprobs:
            raise APIError(
                400,
                f"{name}: requested {count} logprobs per token, more than the {self.max_logprobs} "
                "this server allows (serve --max-logprobs; -1 allows the whole vocabulary)",
                param=name,
            )
        return count

    def check_common(self, req: p.SamplingFields) -> None:
        """The checks both routes share. Raises APIError."""
        self.served.check_model(req.model)
        check_request_fields(req)  # type: ignore[arg-type]
        check_vllm_fields(req)
        best_of = getattr(req, "best_of", None)
        for name, value in (("n", req.n), ("best_of", best_of)):
            if value is not None and not 1 <= value <= MAX_CHOICES:
                raise APIError(400, f"{name}: expected 1..{MAX_CHOICES}, got {value}", param=name)
        num_prompts = len(prompts_of(req.prompt)) if isinstance(req, p.CompletionRequest) else 1
        self.limits.check_sequences(req, num_prompts)
        if req.stream and best_of is not None and best_of > req.n:
            raise APIError(400, "best_of: cannot stream when best_of > n", param="best_of")
        if req.prompt_logprobs is not None:
            self.num_logprobs("prompt_logprobs", req.prompt_logprobs)
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
            allowed = req.allowed_token_ids
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
                seed=engine_seed(req.seed),
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                stop=_stops(req.stop),
                stop_token_ids=tuple(req.stop_token_ids or ()),
                include_stop_str_in_output=req.include_stop_str_in_output,
                ignore_eos=req.ignore_eos,
                skip_special_tokens=req.skip_special_tokens,
                speculative_decoding="auto" if req.speculative else "off",
                allowed_token_ids=None if allowed is None else tuple(allowed),
                bad_words_token_ids=self.bad_words(req),
                max_logprobs=self.max_logprobs,
                **extra,
            )
            params.check_vocab(self.spec.vocab_size)
            return params
        except ValueError as exc:
            raise value_error(exc) from exc

    def bad_words(self, req: p.SamplingFields) -> tuple[tuple[int, ...], ...]:
        """The token sequences of the request's ``bad_words``. Raises APIError."""
        if not req.bad_words:
            return ()
        if self.spec.tokenizer is None:
            raise APIError(400, "bad_words: this model has no tokenizer", param="bad_words")
        return tuple(tuple(s) for s in bad_word_ids(req.bad_words, self.spec.tokenizer))

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
            if isinstance(prompt, str) and req.add_special_tokens is False:
                tokenizer = self.spec.tokenizer
                prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
                ids = self.spec.encode(prompt_ids) if prompt_ids else []
            else:
                ids = self.spec.encode(prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from exc
        whole = ids
        ids = self.truncate(req, ids, 16)
        if not ids:
            raise APIError(
                400,
                "truncate_prompt_tokens: leaves no prompt token",
                param="truncate_prompt_tokens",
            )
        least = 0 if req.echo else 1
        max_tokens = self.limits.resolve_max_tokens(req, len(ids), 16, least=least)
        logprobs = self.num_logprobs("logprobs", req.logprobs, whole_vocab=False)
        prompt_logprobs = self.num_logprobs("prompt_logprobs", req.prompt_logprobs)
        params = self.params(
            req,
            max_tokens,
            best_of=req.best_of,
            logprobs=logprobs,
            prompt_logprobs=_most(logprobs if req.echo else None, prompt_logprobs),
        )
        echo_text = None
        if req.echo:
            echo_text = (
                prompt
                if isinstance(prompt, str) and ids == whole
                else self.spec.tokenizer.decode(ids)
            )
        return Prepared(
            ids,
            params,
            echo_text,
            logprobs,
            prompt_logprobs=prompt_logprobs,
            token_ids=bool(req.return_token_ids),
            tokens_as_ids=bool(req.return_tokens_as_token_ids),
        )

    def truncate(self, req: p.SamplingFields, ids: list[int], default_max: int) -> list[int]:
        """The prompt ids under the request's ``truncate_prompt_tokens`` (vLLM's rules: -1 or
        a size check use the context left beside the requested ``max_tokens``)."""
        if req.truncate_prompt_tokens is None:
            return ids
        limit = self.limits.max_model_len
        asked = req.max_completion_tokens or req.max_tokens or default_max
        max_input = None if limit is None else max(limit - asked, 0)
        return truncated(ids, req.truncate_prompt_tokens, req.truncation_side, max_input)

    def chat(self, req: p.ChatCompletionRequest) -> Prepared:
        """Validate a chat request and render it with the chat template. Raises APIError."""
        self.check_common(req)
        if req.top_logprobs not in (None, 0) and not req.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        top = self.num_logprobs("top_logprobs", req.top_logprobs)
        num_top = (top or 0) if req.logprobs else None
        tools = self.tool_planner.plan(req)

        def check(text: str) -> None:
            self.limits.check_prompt_bytes(text, "messages")

        ids = self.truncate(req, chat_prompt_ids(req, self.spec.tokenizer, check), 0)
        if not ids:
            raise APIError(
                400,
                "truncate_prompt_tokens: leaves no prompt token",
                param="truncate_prompt_tokens",
            )
        max_tokens = self.limits.resolve_max_tokens(req, len(ids), self.default_max_tokens)
        prompt_logprobs = self.num_logprobs("prompt_logprobs", req.prompt_logprobs)
        params = self.params(req, max_tokens, logprobs=num_top, prompt_logprobs=prompt_logprobs)
        last = req.messages[-1]
        echo_text = last.text() if req.echo and last.role == "assistant" else None
        return Prepared(
            ids,
            params,
            echo_text,
            num_top,
            tools,
            prompt_logprobs,
            token_ids=bool(req.return_token_ids),
            tokens_as_ids=bool(req.return_tokens_as_token_ids),
        )


def _most(a: int | None, b: int | None) -> int | None:
    """The larger of two optional counts (None when both are None)."""
    return b if a is None else a if b is None else max(a, b)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)
