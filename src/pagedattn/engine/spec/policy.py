"""How many tokens a sequence drafts: the drafts whose expected gain pays for their verify rows.

A verify row is cheaper than a decode step (the fused decode path decodes each weight block
once for up to 8 rows, see :mod:`pagedattn.model.block_dot`) but not free: on SmolLM2-135M a
row adds about ``ROW_COST`` of a one-row step for the projections and the LM head, plus its
attention over the context, which grows with the sequence (``ATTENTION_PER_KEY`` of a
one-row step per key). Draft ``j`` (from 1) is kept only when drafts ``1 .. j`` are all
accepted; with a per-draft acceptance ``p`` that is ``p ** j`` expected tokens. Adding it to a
step of ``R`` rows pays when it gains more tokens per unit of step time than the step's rows
already do:

    p ** j >= c * R / (1 + c * (R - 1)),   c = the row's cost relative to a one-row step

so a single stream drafts while ``p ** j >= c`` (about 0.3), and a large batch, whose rows
already share each weight, drafts only at very high acceptance: speculation switches itself
off where it does not pay. ``p`` is each sequence's own: accepted and rejected drafts counted
with a decay of ``DECAY`` per verify, starting from a prior of one half. A sequence whose
estimate allows no draft stops drafting for 2, 4, 8, then 16 steps, then probes with one.
"""

from __future__ import annotations

import dataclasses
import math

from pagedattn.engine.spec.ngram import NgramIndex

ROW_COST = 0.25  # SchedulerConfig.speculative_row_cost's default: projections + LM head
ATTENTION_PER_KEY = 2.5e-4  # one row's attention per context key, same unit
DECAY = 0.7  # weight of the previous verifies' counts at each verify
PRIOR = 0.5  # pseudo-count of acceptances (and twice of drafts) before any verify
MAX_PAUSE_STEPS = 16


def row_cost(context_len: int, base: float = ROW_COST) -> float:
    """A verify row's cost relative to a one-row decode step of a ``context_len`` sequence,
    ``base`` that of its projections and LM head (0: rows are treated as free)."""
    if base <= 0.0:
        return 0.0
    attention = ATTENTION_PER_KEY * context_len
    return (base + attention) / (1.0 + attention)


def pays_threshold(cost: float, rows: int) -> float:
    """The expected tokens a draft must bring to be worth adding to a step of ``rows`` rows."""
    return cost * rows / (1.0 + cost * (rows - 1))


@dataclasses.dataclass
class DraftState:
    """One sequence's speculation: its n-gram index and acceptance estimate."""

    index: NgramIndex
    accepted: float = 0.0  # decayed count of accepted drafts
    rejected: float = 0.0  # decayed count of verifies that rejected a draft
    pause: int = 0  # steps left without drafting
    pauses: int = 0  # pauses in a row (each twice as long, up to MAX_PAUSE_STEPS)
    probe_due: bool = False  # a pause ended: draft one token even if none pays

    @property
    def acceptance(self) -> float:
        """The estimated chance that the next draft is accepted, given the previous ones were."""
        return (self.accepted + PRIOR) / (self.accepted + self.rejected + 2 * PRIOR)

    def num_tokens(
        self, most: int, context_len: int, rows: int, base_cost: float = ROW_COST
    ) -> int:
        """Drafts worth verifying in a step of ``rows`` decode rows so far (0: none pay), at
        most ``most``; ``base_cost`` as in :func:`row_cost`."""
        p = self.acceptance
        if most <= 0:
            return 0
        need = pays_threshold(row_cost(context_len, base_cost), rows)
        if need <= 0.0 or p >= 1.0:
            return most
        if need >= 1.0 or p <= 0.0:
            return 0
        return min(most, int(math.log(need) / math.log(p)))

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """Count a verify that accepted ``num_accepted`` of ``num_drafted`` drafts."""
        self.accepted = DECAY * self.accepted + num_accepted
        self.rejected = DECAY * self.rejected + (1 if num_accepted < num_drafted else 0)
        if num_accepted > 0:
            self.pauses = 0

    def hold(self) -> None:
        """No draft pays now: skip the next 2, 4, 8, then 16 steps (then probe with one)."""
        self.pauses += 1
        self.pause = min(2**self.pauses, MAX_PAUSE_STEPS)
        self.probe_due = True
