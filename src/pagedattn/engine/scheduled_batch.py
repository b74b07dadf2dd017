"""ScheduledBatch: the scheduler's decision for one step, handed to the model runner."""

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


@dataclass(frozen=True)
class ScheduledBatch:
    """Everything the model runner needs for one step.

    Attributes:
        seqs: the scheduled sequences, in batch order.
        page_tables: (len(seqs), max_pages_per_seq) int32 page ids, -1 padded / evicted.
    """

    seqs: list[ScheduledSeq]
    page_tables: np.ndarray

    @property
    def num_tokens(self) -> int:
        """New tokens of the step, drafts not counted."""
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def num_draft_tokens(self) -> int:
        """Drafted tokens the step verifies (each one more decode row)."""
        return sum(len(s.draft_token_ids) for s in self.seqs)

    @property
    def sampling_seqs(self) -> list[Sequence]:
        """Sequences that get a new token this step, in batch order."""
        return [s.seq for s in self.seqs if s.samples]

    @property
    def sample_rows(self) -> list[Sequence]:
        """One entry per token sampled this step, in runner output order: each sampling
        sequence, followed by the children it forks into this step (they sample from the same
        logits row with their own generators)."""
        return [r for s in self.seqs if s.samples for r in (s.seq, *s.seq.fork_children)]
