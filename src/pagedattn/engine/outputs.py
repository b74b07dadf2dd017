"""What the engine hands back, shaped like vLLM's outputs: ``RequestOutput`` per request holding
one ``CompletionOutput`` per completion (per-step deltas from ``LLMEngine.step``, whole ones
from ``LLM.generate``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# Finish reasons. The two rejections end a request before any model work.
FINISH_STOP = "stop"  # a stop string, a stop token id or end-of-sequence
FINISH_LENGTH = "length"  # max_tokens generated, or the request reached max_model_len
FINISH_ABORT = "abort"  # LLMEngine.abort
FINISH_ERROR = "error"  # this request failed (its step, its sampling row, its detokenization)
REJECT_CONTEXT = "context_length_exceeded"  # prompt longer than max_model_len
REJECT_CAPACITY = "cache_capacity_exceeded"  # would need more pages than the whole pool
FINISH_REASONS = (
    FINISH_STOP,
    FINISH_LENGTH,
    FINISH_ABORT,
    FINISH_ERROR,
    REJECT_CONTEXT,
    REJECT_CAPACITY,
)
REJECTIONS = (REJECT_CONTEXT, REJECT_CAPACITY)


class DeadEndError(ValueError):
    """A row whose constraints leave no token to sample mid-output (a grammar that reached a
    parser limit, ``min_tokens`` past where a grammar ends): the completion ends there with
    finish reason ``length``, its text cut as a length limit cuts it, not as a failure."""


def is_dead_end(error: str) -> bool:
    """Whether a row's error message (``"<exception name>: <message>"``) is a dead end."""
    return error.startswith(f"{DeadEndError.__name__}:")


@dataclass
class RequestMetrics:
    """Timestamps of one request, ``time.monotonic()`` seconds (None until it happens).

    TTFT = first_token_time - arrival_time; e2e = finish_time - arrival_time; the inter-token
    latencies are the differences of consecutive token times the caller observes per step.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None


@dataclass
class Logprob:
    """One token's log-probability (vLLM's ``Logprob``).

    Attributes:
        logprob: natural-log probability, float (log-softmax of the raw logits).
        rank: 1-based rank of the token among all logits (1 = the most likely), or None.
        decoded_token: the token's text, or None without a tokenizer.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One position's logprobs: token id -> Logprob (the chosen token plus the top-N).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion (one of a request's ``n``), vLLM's ``CompletionOutput``.

    From ``LLMEngine.step()`` it is a delta: ``text``, ``token_ids`` and ``logprobs`` hold only
    what is new since this completion's previous output (vLLM's ``output_kind=DELTA``); from
    ``LLM.generate`` it is the whole completion.

    Attributes:
        index: which of the request's completions (0 .. n - 1).
        text: output text (never part of a stop string; a delta may be empty while text that
            could start a stop string is held back).
        token_ids: generated token ids.
        cumulative_logprob: sum of the sampled tokens' logprobs so far (None when not asked).
        logprobs: one ``PositionLogprobs`` per token in ``token_ids`` when the request asked
            for logprobs, else None.
        finish_reason: None while running; else one of ``FINISH_REASONS``.
        stop_reason: the stop string or stop token id that ended it, else None.
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One request's output, vLLM's ``RequestOutput``.

    ``LLMEngine.step()`` returns one per request that produced something this step, with delta
    ``outputs`` (only the completions that changed); ``LLM.generate`` returns one final
    ``RequestOutput`` per prompt with whole ``outputs``, ordered by index.

    Attributes:
        request_id: the id ``add_request`` returned.
        prompt: the prompt text, or None when it was given as token ids.
        prompt_token_ids: the prompt's token ids.
        prompt_logprobs: per prompt token, its ``PositionLogprobs`` (None for the first
            token) when the request asked for prompt logprobs, else None.
        outputs: the completions (see above).
        finished: True on the request's last output (every completion finished).
        num_cached_tokens: prompt tokens served from the prefix cache at first admission.
        error: a human-readable reason when the request was rejected or failed, else None.
        metrics: the request's timestamps.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    error: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def merge_delta(results: dict[str, RequestOutput], delta: RequestOutput) -> RequestOutput:
    """Fold one step's delta RequestOutput into ``results[delta.request_id]`` (created on the
    request's first delta) and return the accumulated output: text, token ids and logprobs
    joined per completion index, the latest finish state, metrics and error."""
    acc = results.get(delta.request_id)
    if acc is None:
        acc = dataclasses.replace(delta, outputs=[], prompt_logprobs=delta.prompt_logprobs)
        results[delta.request_id] = acc
    by_index = {c.index: c for c in acc.outputs}
    for c in delta.outputs:
        whole = by_index.get(c.index)
        if whole is None:
            whole = CompletionOutput(index=c.index, logprobs=None if c.logprobs is None else [])
            by_index[c.index] = whole
        whole.text += c.text
        whole.token_ids = [*whole.token_ids, *c.token_ids]
        if c.logprobs is not None:
            whole.logprobs = [*(whole.logprobs or []), *c.logprobs]
        whole.cumulative_logprob = c.cumulative_logprob
        whole.finish_reason = c.finish_reason
        whole.stop_reason = c.stop_reason
    acc.outputs = [by_index[i] for i in sorted(by_index)]
    if delta.prompt_logprobs is not None:
        acc.prompt_logprobs = delta.prompt_logprobs
    acc.finished = delta.finished
    acc.num_cached_tokens = delta.num_cached_tokens
    acc.metrics = delta.metrics
    acc.error = delta.error
    return acc
