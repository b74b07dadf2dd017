"""Plain engine counters for metrics (no Prometheus here: the server exports them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    """Monotonic counters (tokens are token counts) plus the latest step's batch size.

    Attributes:
        num_prompt_tokens: prompt tokens of admitted requests (counted once per request).
        num_generation_tokens: sampled tokens.
        num_computed_tokens: tokens whose K/V a forward computed (prefill, decode, recompute).
        prefix_cache_queries: prompt tokens looked up at a request's first admission.
        prefix_cache_hits: of those, tokens served from the prefix cache. Re-admission after a
            preemption is neither a query nor a hit.
        num_preemptions: sequences preempted (by recompute) for lack of pages.
        num_finished: finished requests by finish reason (rejections and aborts included).
        num_steps: steps that ran the model.
        last_step_num_seqs, last_step_num_tokens: the latest step's batch size in sequences
            and in new tokens (observe after each ``step()`` for a histogram).
        total_step_num_seqs: sum of the per-step sequence counts (mean = / num_steps).
        spec_num_drafted_tokens: tokens drafted by speculative decoding (verified rows).
        spec_num_accepted_tokens: of those, drafts the sampled tokens confirmed and whose KV
            was kept (each one token generated without a step of its own).
        spec_num_verifies: sequence-steps that verified drafts.
    """

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_computed_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_finished: Counter[str] = field(default_factory=Counter)
    num_steps: int = 0
    last_step_num_seqs: int = 0
    last_step_num_tokens: int = 0
    total_step_num_seqs: int = 0
    spec_num_drafted_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_verifies: int = 0

    def record_step(self, num_seqs: int, num_tokens: int) -> None:
        """Count one model step of ``num_seqs`` sequences and ``num_tokens`` new tokens."""
        self.num_steps += 1
        self.last_step_num_seqs = num_seqs
        self.last_step_num_tokens = num_tokens
        self.total_step_num_seqs += num_seqs
        self.num_computed_tokens += num_tokens
