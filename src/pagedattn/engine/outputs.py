"""What the engine hands back: per-step deltas and whole finished requests."""

from __future__ import annotations

from dataclasses import dataclass, field

# Finish reasons. The two rejections end a request before any model work.
FINISH_STOP = "stop"  # a stop string, a stop token id or end-of-sequence
FINISH_LENGTH = "length"  # max_tokens generated, or the request reached max_model_len
FINISH_ABORT = "abort"  # LLMEngine.abort
REJECT_CONTEXT = "context_length_exceeded"  # prompt longer than max_model_len
REJECT_CAPACITY = "cache_capacity_exceeded"  # would need more pages than the whole pool
FINISH_REASONS = (FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, REJECT_CONTEXT, REJECT_CAPACITY)


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
class RequestOutput:
    """What one ``LLMEngine.step()`` produced for one request.

    Attributes:
        request_id: the id ``add_request`` returned.
        text: new output text since the previous output of this request (never part of a stop
            string; may be empty while text is held back).
        token_ids: new generated token ids since the previous output.
        finished: True on the request's last output.
        finish_reason: None while running; else one of ``FINISH_REASONS``.
        error: a human-readable reason for a rejection, else None.
        num_prompt_tokens: prompt length in tokens.
        num_cached_tokens: prompt tokens served from the prefix cache at first admission.
        num_generated_tokens: generated tokens so far (all of them, not just this delta).
        metrics: the request's timestamps.
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    metrics: RequestMetrics
    error: str | None = None


@dataclass
class CompletionOutput:
    """One finished request as ``LLM.generate`` returns it (all deltas joined).

    Attributes:
        request_id: the engine's request id.
        prompt: the prompt as given (text, or token ids).
        prompt_token_ids: the prompt's token ids.
        text: the whole output text (stop strings excluded).
        token_ids: every generated token id.
        finish_reason: one of ``FINISH_REASONS``; error: the rejection reason, else None.
        num_cached_tokens: prompt tokens served from the prefix cache.
        metrics: the request's timestamps.
    """

    request_id: str
    prompt: str | list[int]
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
