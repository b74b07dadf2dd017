"""SamplerOutput: what one model-runner step returns to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagedattn.engine.logprobs import TokenLogprobs
from pagedattn.engine.spec.acceptance import AcceptedRun


@dataclass(frozen=True)
class SamplerOutput:
    """The sampled tokens of one step, with the logprobs their requests asked for.

    Attributes:
        token_ids: (len(batch.sample_rows),) int64 sampled ids, in ``sample_rows`` order.
        logprobs: per sample row, the sampled token's :class:`TokenLogprobs` when its request
            needs them (``SamplingParams.needs_logprob``), else None.
        prompt_logprobs: seq_id -> (first position, logprobs): entry ``j`` holds the logprob of
            prompt token ``first + j`` (computed from the logits row of position
            ``first + j - 1``), for sequences that asked for prompt logprobs.
        errors: sample row -> why that row has no token (NaN logits, a logits processor
            raising...; its id is -1): that request fails alone.
        accepted: sample row -> the tokens a drafted sequence gains after that row's token
            (speculative decoding, :func:`pagedattn.engine.spec.acceptance.sample_run`).
    """

    token_ids: np.ndarray
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    prompt_logprobs: dict[int, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    accepted: dict[int, AcceptedRun] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> SamplerOutput:
        return cls(np.zeros(0, dtype=np.int64))
