"""ScheduledSeq: one sequence's share of the step the scheduler is planning (frozen into a
:class:`~pagedattn.engine.step_plan.StepPlan` once the whole step is reserved)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagedattn.engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a step.

    Attributes:
        seq: the sequence; its new tokens are ``seq.token_ids[start : start + num_new_tokens]``
            with ``start = seq.num_computed_tokens`` (unchanged until postprocess).
        num_new_tokens: tokens whose K/V this step computes, >= 1.
        slot_mapping: (num_new_tokens,) int64 KV slot of each new token.
        samples: True when the step reaches the end of the sequence, so its last new token's
            logits are sampled (a mid-prompt chunk does not sample, nor a ``max_tokens=0``
            request).
        draft_token_ids: tokens drafted after the sequence's last token (speculative
            decoding, :mod:`pagedattn.engine.spec`): verified in this step as extra decode
            rows, one per draft, their KV at ``draft_slot_mapping``; empty for a plain step.
            Only the drafts the sampled tokens confirm are committed (in postprocess).
        draft_slot_mapping: (len(draft_token_ids),) int64 KV slots of the drafts.
    """

    seq: Sequence
    num_new_tokens: int
    slot_mapping: np.ndarray
    samples: bool
    draft_token_ids: tuple[int, ...] = ()
    draft_slot_mapping: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def start(self) -> int:
        """Position of the first new token."""
        return self.seq.num_computed_tokens
