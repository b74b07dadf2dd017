"""Sequence: one request's tokens, progress through the cache, and finish state.

Progress is one number, as in vLLM v1: ``num_computed_tokens`` of the ``num_tokens`` tokens
(prompt + generated) have their K/V in the cache. Prefill, chunked prefill, decode and resume
after preemption are all "compute the next tokens up to num_tokens"; a step that reaches
``num_tokens`` samples one new token.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import numpy as np

from pagedattn.engine.logprobs import TokenLogprobs, to_position_logprobs
from pagedattn.engine.outputs import (
    FINISH_LENGTH,
    FINISH_STOP,
    CompletionOutput,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from pagedattn.engine.stop import StopStringTracker
from pagedattn.sampling_params import SamplingParams


class TextStream(Protocol):
    """Incremental detokenizer: one token id in, the new text out (never half a character).

    ``pagedattn.model.detokenizer.IncrementalDetokenizer`` implements it.
    """

    def add_token(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"  # its prefix is being read from the persistent tier
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """State of one request inside the engine.

    Args:
        seq_id: the cache manager's id of this sequence (unique for the engine's lifetime).
        request_id: the caller's id.
        prompt_token_ids: the prompt, non-empty.
        params: sampling parameters.
        generator: this request's random generator.
        arrival_time: ``time.monotonic()`` when it was added.
        text_stream: incremental detokenizer, or None (token ids only, text stays empty).
        max_model_len: finish with "length" once prompt + generated reach this many tokens;
            None = no limit.
        prompt: the prompt text as the caller gave it (None for token-id prompts).
        decode_token: one token id -> its text (logprobs' ``decoded_token``); None = no text.
        special_stops: special-token id -> the stop string equal to its text: sampling that
            token stops like the stop string (special tokens never reach the text stream).
        metrics: shared with the other child requests of a request with ``n`` / ``best_of``
            > 1 (:mod:`pagedattn.engine.parent_request`); None = a new one.
        prefix_lead: a sibling child request whose prompt pages this one waits for: it is not
            admitted until the lead sampled its first token (its full prompt pages are then in
            the prefix index) or finished; None = admitted in its turn.

    Raises:
        ValueError: an empty prompt.
    """

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        generator: np.random.Generator,
        arrival_time: float,
        text_stream: TextStream | None = None,
        max_model_len: int | None = None,
        prompt: str | None = None,
        decode_token: Callable[[int], str] | None = None,
        special_stops: Mapping[int, str] | None = None,
        metrics: RequestMetrics | None = None,
        prefix_lead: Sequence | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt has no tokens")
        self.seq_id = seq_id
        self.request_id = request_id
        self.token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self._prompt_token_ids = list(self.token_ids)
        self.prompt = prompt
        self.params = params
        self.generator = generator
        self.text_stream = text_stream
        self.max_model_len = max_model_len
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit of the first admission (reported)
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.stop_reason: int | str | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time) if metrics is None else metrics
        self.decode_token = decode_token
        self.special_stops = dict(special_stops or {})
        self.prefix_lead = prefix_lead
        self.was_scheduled = False  # its first admission was committed (stats, cached tokens)
        self.cumulative_logprob: float | None = 0.0 if params.needs_logprob else None
        # Per prompt token its logprobs (index 0 stays None) once all are computed.
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        # computed so far, each chunk's converted as it comes (not all at the prompt's end)
        self._prompt_lp: dict[int, PositionLogprobs] = {}
        if params.prompt_logprobs is not None and self.num_prompt_tokens == 1:
            self.prompt_logprobs = [None]
        self._stop = StopStringTracker(params.stop, params.include_stop_str_in_output)
        self._pending_text = ""
        self._pending_token_ids: list[int] = []
        self._pending_logprobs: list[PositionLogprobs] = []
        self._finish_reported = False
        self._prompt_logprobs_sent = False

    # ---- sizes -----------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prompt_logits(self) -> bool:
        """True while prompt logprobs are asked for and not all computed yet."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None

    @property
    def has_delta(self) -> bool:
        """True when :meth:`take_delta` has something new (tokens, text or the finish)."""
        return bool(
            self._pending_token_ids
            or self._pending_text
            or (self.is_finished and not self._finish_reported)
        )

    @property
    def waits_for_lead(self) -> bool:
        """True while its :attr:`prefix_lead` has neither sampled a token nor finished."""
        lead = self.prefix_lead
        return lead is not None and not lead.is_finished and lead.num_generated_tokens == 0

    @property
    def text(self) -> str:
        """The output text kept so far (emitted or held back; never a stop string)."""
        return self._stop.text

    # ---- transitions -----------------------------------------------------------------------
    def add_prompt_logprobs(self, first: int, logprobs: list[TokenLogprobs]) -> None:
        """Record prompt logprobs of positions ``first ..`` (from the runner); once every
        prompt token from position 1 on has one, :attr:`prompt_logprobs` is set."""
        for j, tl in enumerate(logprobs):
            self._prompt_lp[first + j] = to_position_logprobs(tl, self.decode_token)
        if len(self._prompt_lp) >= self.num_prompt_tokens - 1:
            lps = self._prompt_lp
            self.prompt_logprobs = [None, *(lps[i] for i in range(1, self.num_prompt_tokens))]

    def append_token(
        self,
        token_id: int,
        eos_token_ids: Collection[int],
        now: float,
        logprobs: TokenLogprobs | None = None,
    ) -> None:
        """Record one sampled token (with its logprobs when asked) and decide whether the
        request is finished.

        Order of checks: a stop token id or end-of-sequence (unless ``ignore_eos``) ends with
        "stop" and adds no text; a special token whose text is a stop string ends with "stop";
        then the token's text may complete a stop string ("stop", text cut before it unless
        ``include_stop_str_in_output``; not checked before ``min_tokens`` tokens); then
        ``max_tokens`` / ``max_model_len`` end with "length".
        """
        self.token_ids.append(token_id)
        self._pending_token_ids.append(token_id)
        if logprobs is not None:
            self._pending_logprobs.append(to_position_logprobs(logprobs, self.decode_token))
            if self.cumulative_logprob is not None:
                self.cumulative_logprob += logprobs.logprob
        m = self.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        p = self.params
        if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in eos_token_ids):
            self.stop_reason = token_id if token_id in p.stop_token_ids else None
            self.finish(FINISH_STOP, now)
            return
        checking = self.num_generated_tokens > p.min_tokens  # vLLM: min_tokens come first
        if token_id in self.special_stops and checking:
            self.stop_reason = self.special_stops[token_id]
            self.finish(FINISH_STOP, now)  # releases held-back text: it was no stop string
            if p.include_stop_str_in_output:
                self._stop.text += self.stop_reason
                self._pending_text += self._stop.flush()
            return
        if self.text_stream is not None:
            delta, stopped = self._stop.add(self.text_stream.add_token(token_id), checking)
            self._pending_text += delta
            if stopped:
                self.stop_reason = self._stop.matched
                self.finish(FINISH_STOP, now)
                return
        over_len = self.max_model_len is not None and self.num_tokens >= self.max_model_len
        if self.num_generated_tokens >= p.max_tokens or over_len:
            self.finish(FINISH_LENGTH, now)

    def finish(self, reason: str, now: float, error: str | None = None) -> None:
        """Mark finished; held-back text is released unless a stop string matched or the
        request failed (``error``: the text stream may be what failed)."""
        if self.is_finished:
            return
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.metrics.finish_time = now
        if error is not None:
            return
        if not self._stop.stopped and self.text_stream is not None:
            # Unless a stop string matched, the detokenizer's held-back unfinished character is
            # the last text; it may itself complete a stop string (then cut, reason unchanged).
            delta, _ = self._stop.add(self.text_stream.flush())
            self._pending_text += delta
        self._pending_text += self._stop.flush()

    def preempt(self) -> None:
        """Back to waiting, keeping every generated token; its K/V will be recomputed."""
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions += 1

    def take_delta(self) -> CompletionOutput:
        """This completion's delta since the previous call (clears it)."""
        completion = CompletionOutput(
            index=0,
            text=self._pending_text,
            token_ids=self._pending_token_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=self._pending_logprobs if self.params.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
        self._pending_text = ""
        self._pending_token_ids = []
        self._pending_logprobs = []
        self._finish_reported = self.is_finished
        return completion

    def take_output(self) -> RequestOutput | None:
        """The request's delta since the previous call (its one completion, index 0), or None
        when nothing is new; the prompt logprobs come once, in the first output after they
        were all computed."""
        prompt_logprobs = None
        if self.prompt_logprobs is not None and not self._prompt_logprobs_sent:
            prompt_logprobs = self.prompt_logprobs
            self._prompt_logprobs_sent = True
        if not self.has_delta and prompt_logprobs is None:
            return None
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self._prompt_token_ids,
            outputs=[self.take_delta()] if self.has_delta else [],
            finished=self.is_finished,
            metrics=self.metrics,
            num_cached_tokens=self.num_cached_tokens,
            prompt_logprobs=prompt_logprobs,
            error=self.error,
        )
