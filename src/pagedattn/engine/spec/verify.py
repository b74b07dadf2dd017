"""The verify rows of a drafted sequence: its step token and each draft as its own decode row.

A sequence at position ``L`` (its last token's KV not yet computed) with drafts
``d_1 .. d_k`` is verified as ``k + 1`` one-token rows of the ForwardBatch, each a "sequence"
of its own over the same page table: row ``j`` holds token ``L + j`` (the step token, then
``d_j``), its KV slot, and attends over ``L + j + 1`` keys. The model writes every row's K/V
(each layer) before any row attends, and the decode kernel reads only a row's own
``context_lens`` keys, so row ``j`` is computed with exactly the arithmetic, over exactly the
keys, of the plain decode step that would compute position ``L + j`` after ``d_1 .. d_j`` were
sampled: a decode row's logits are bitwise independent of the rest of its batch (see
:class:`pagedattn.model.llama.LlamaModel`). A prefill chunk of ``k + 1`` tokens would not be:
the prefill kernel rounds differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.engine.scheduled_batch import ScheduledSeq


@dataclass(frozen=True)
class VerifyRows:
    """The ``1 + len(drafts)`` decode rows of one drafted sequence.

    Attributes:
        input_ids: (rows,) int64: the step token, then the drafts.
        positions: (rows,) int64: ``L .. L + k``.
        slot_mapping: (rows,) int64: the step token's slot, then the drafts'.
        context_lens: (rows,) int32: ``L + 1 .. L + k + 1``.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    context_lens: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])


def verify_rows(s: ScheduledSeq) -> VerifyRows:
    """The decode rows that verify ``s``'s drafts (see the module doc).

    Raises:
        ValueError: ``s`` is not a one-token decode step, or its draft slots do not match its
            drafts.
    """
    k = len(s.draft_token_ids)
    if s.num_new_tokens != 1 or s.slot_mapping.shape != (1,):
        raise ValueError(
            f"request {s.seq.request_id!r}: drafts need a one-token decode step, got "
            f"{s.num_new_tokens} new tokens"
        )
    if s.draft_slot_mapping.shape != (k,):
        raise ValueError(
            f"request {s.seq.request_id!r}: draft_slot_mapping expected shape ({k},), got "
            f"{s.draft_slot_mapping.shape}"
        )
    start = s.start
    return VerifyRows(
        input_ids=np.asarray([s.seq.token_ids[start], *s.draft_token_ids], dtype=np.int64),
        positions=np.arange(start, start + k + 1, dtype=np.int64),
        slot_mapping=np.concatenate([s.slot_mapping, s.draft_slot_mapping]).astype(np.int64),
        context_lens=np.arange(start + 1, start + k + 2, dtype=np.int32),
    )
