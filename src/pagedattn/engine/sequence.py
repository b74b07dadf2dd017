"""Sequence: one request's tokens, progress through the cache, and finish state.

Progress is one number, as in vLLM v1: ``num_computed_tokens`` of the ``num_tokens`` tokens
(prompt + generated) have their K/V in the cache. Prefill, chunked prefill, decode and resume
after preemption are all "compute the next tokens up to num_tokens"; a step that reaches
``num_tokens`` samples one new token.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Protocol

import numpy as np

from pagedattn.engine.outputs import (
    FINISH_LENGTH,
    FINISH_STOP,
    CompletionOutput,
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
        index: which of its request's completions this sequence is (0 .. n - 1).

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
        index: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt has no tokens")
        self.seq_id = seq_id
        self.request_id = request_id
        self.token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self._prompt_token_ids = list(self.token_ids)
        self.prompt = prompt
        self.index = index
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
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self._stop = StopStringTracker(params.stop)
        self._pending_text = ""
        self._pending_token_ids: list[int] = []

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
    def text(self) -> str:
        """The output text kept so far (emitted or held back; never a stop string)."""
        return self._stop.text

    # ---- transitions -----------------------------------------------------------------------
    def append_token(self, token_id: int, eos_token_ids: Collection[int], now: float) -> None:
        """Record one sampled token and decide whether the request is finished.

        Order of checks: a stop token id or end-of-sequence (unless ``ignore_eos``) ends with
        "stop" and adds no text; then the token's text may complete a stop string ("stop", text
        cut before it); then ``max_tokens`` / ``max_model_len`` end with "length".
        """
        self.token_ids.append(token_id)
        self._pending_token_ids.append(token_id)
        m = self.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        p = self.params
        if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in eos_token_ids):
            self.finish(FINISH_STOP, now)
            return
        if self.text_stream is not None:
            delta, stopped = self._stop.add(self.text_stream.add_token(token_id))
            self._pending_text += delta
            if stopped:
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

    def take_output(self) -> RequestOutput:
        """The delta since the previous call (clears the pending delta): a RequestOutput whose
        one CompletionOutput holds the new text and token ids."""
        completion = CompletionOutput(
            index=self.index,
            text=self._pending_text,
            token_ids=self._pending_token_ids,
            finish_reason=self.finish_reason,
        )
        out = RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self._prompt_token_ids,
            outputs=[completion],
            finished=self.is_finished,
            metrics=self.metrics,
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
        )
        self._pending_text = ""
        self._pending_token_ids = []
        return out
