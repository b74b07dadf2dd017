"""How many tokens a sequence drafts: the number that maximises the step's expected tokens per
unit of step time.

**Cost.** A verify row is cheaper than a decode step but not free. The fused decode layer
decodes each weight block once in registers for up to ``PASS_ROWS`` rows (8 with AVX-512's 32
registers, 4 otherwise; :mod:`pagedattn.model.block_dot`), so a row adds only its own
multiply-adds: on SmolLM2-135M (Q4_1, one thread) about ``ROW_COST`` of a one-row step for the
projections and the LM head, plus its attention over the context
(``ROW_ATTENTION_PER_KEY`` per key, while the one-row step itself grows by
``STEP_ATTENTION_PER_KEY`` per key). With AVX-512, each further ``PASS_ROWS`` rows decode every
weight again: ``PASS_COST`` of a step. Measured on a Zen 4 EPYC (one thread, 400 keys): 1 row
16.9 ms, 2 rows 19.7, 4 rows 26.4, 8 rows 38.8, 9 rows 53.2. With 16 registers (AVX2), a step
of more than 4 rows leaves the fused layer for the general path, which decodes the weights
once into a float32 scratch for all rows: not measured here, so no pass cost is modelled
there (``PASS_COST`` 0).

**Acceptance.** Draft ``j`` (from 1) is kept only when drafts ``1 .. j - 1`` were, and how
likely it is depends on how long the match behind it is: a request that copies a run of its
prompt (a quote, a JSON field, a line of code) matches the run for many tokens and rarely
leaves it, while a two-token match in free text is often a coincidence. The lookup reports its
match length ``m`` (:class:`~pagedattn.engine.spec.ngram.Proposal`); draft ``j`` stands on a
match of ``m + j - 1`` tokens. Each sequence keeps, per match-length bucket
(:data:`BUCKETS`), its own decayed count of drafts verified and accepted there, starting from
the prior ``m / (m + 2)`` at the bucket's shortest match, worth ``PRIOR_WEIGHT`` drafts.

**Choice.** With ``P_j`` the chance that drafts ``1 .. j`` are all accepted (the product of
their buckets' estimates), a sequence joining a step of ``R`` decode rows drafts the ``k`` that
maximises ``(R + P_1 + ... + P_k) / cost(R + k)``, 0 when no ``k`` beats the step without
drafts. A single stream thus drafts long runs while it copies and nothing in free text whose
short matches fail; a large batch, whose rows already share each weight pass, drafts only
near-certain tokens; and a draft that would start another weight pass must pay for it.
"""

from __future__ import annotations

import dataclasses

from pagedattn.engine.spec.ngram import NgramIndex
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.block_dot import DECODE_COLS

ROW_COST = 0.15  # SchedulerConfig.speculative_row_cost's default: projections + LM head
ROW_ATTENTION_PER_KEY = 2.7e-4  # one verify row's attention per context key, same unit
STEP_ATTENTION_PER_KEY = 6e-4  # a one-row step's growth per context key, same unit
PASS_ROWS = DECODE_COLS  # rows that share one register decode of the weights
PASS_COST = 0.8 if has_wide_registers() else 0.0  # each further weight pass (see above)
BUCKETS = (1, 2, 3, 4, 8, 16)  # shortest match length of each acceptance bucket
PRIOR_WEIGHT = 2.0  # drafts the prior is worth in a bucket's estimate
DECAY = 0.8  # weight of a bucket's earlier counts at each of its new verified drafts


def row_cost(context_len: int, base: float = ROW_COST) -> float:
    """A verify row's cost relative to a one-row decode step of a ``context_len`` sequence,
    ``base`` that of its projections and LM head (0: rows are treated as free)."""
    if base <= 0.0:
        return 0.0
    return (base + ROW_ATTENTION_PER_KEY * context_len) / (
        1.0 + STEP_ATTENTION_PER_KEY * context_len
    )


def step_cost(rows: int, cost: float) -> float:
    """A step of ``rows`` decode rows relative to a one-row step, each row after the first
    ``cost`` and each weight pass after the first :data:`PASS_COST` (none when ``cost`` is 0)."""
    if cost <= 0.0:
        return 1.0
    return 1.0 + cost * (rows - 1) + PASS_COST * ((rows - 1) // PASS_ROWS)


def bucket(match_len: int) -> int:
    """The acceptance bucket of a draft standing on a ``match_len``-token match."""
    b = 0
    while b + 1 < len(BUCKETS) and match_len >= BUCKETS[b + 1]:
        b += 1
    return b


def prior(b: int) -> float:
    """The prior chance that a draft of bucket ``b`` is accepted: ``m / (m + 2)``."""
    m = BUCKETS[b]
    return m / (m + 2)


@dataclasses.dataclass
class DraftState:
    """One sequence's speculation: its n-gram index and acceptance counts per match bucket."""

    index: NgramIndex
    verified: list[float] = dataclasses.field(default_factory=lambda: [0.0] * len(BUCKETS))
    accepted: list[float] = dataclasses.field(default_factory=lambda: [0.0] * len(BUCKETS))
    match_len: int = 0  # the match behind the drafts being verified

    def acceptance(self, match_len: int) -> float:
        """The estimated chance that a draft standing on a ``match_len``-token match is
        accepted, given the drafts before it were."""
        b = bucket(match_len)
        return (self.accepted[b] + PRIOR_WEIGHT * prior(b)) / (self.verified[b] + PRIOR_WEIGHT)

    def num_tokens(
        self, match_len: int, most: int, context_len: int, rows: int, base_cost: float = ROW_COST
    ) -> int:
        """Drafts (at most ``most``, on a ``match_len``-token match) that maximise a step's
        expected tokens per unit of time, joining a step of ``rows`` decode rows (this
        sequence's own step row included); 0 when none pays. ``base_cost`` as in
        :func:`row_cost`."""
        if most <= 0 or match_len <= 0:
            return 0
        cost = row_cost(context_len, base_cost)
        if cost <= 0.0:
            return most
        tokens = float(rows)
        best, best_rate = 0, tokens / step_cost(rows, cost)
        chance = 1.0
        for j in range(1, most + 1):
            chance *= self.acceptance(match_len + j - 1)
            tokens += chance
            rate = tokens / step_cost(rows + j, cost)
            if rate > best_rate:
                best, best_rate = j, rate
        return best

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """Count a verify that accepted ``num_accepted`` of ``num_drafted`` drafts standing
        on a ``self.match_len`` match: drafts ``1 .. num_accepted`` accepted, the next one
        rejected, those after it never judged."""
        for j in range(min(num_accepted + 1, num_drafted)):
            b = bucket(self.match_len + j)
            self.verified[b] = DECAY * self.verified[b] + 1.0
            self.accepted[b] = DECAY * self.accepted[b] + (1.0 if j < num_accepted else 0.0)
