"""ScheduledBatch: the scheduler's decision for one step, handed to the model runner."""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    seq: Sequence
    num_new_tokens: int
    slot_mapping: np.ndarray
    samples: bool

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
        return sum(s.num_new_tokens for s in self.seqs)

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
