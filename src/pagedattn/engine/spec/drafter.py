"""Verify planning: which decoding sequences draft this step, how many tokens, and their KV slots.

Runs at the end of :meth:`Scheduler.schedule`, after the running sequences got their tokens
and the waiting ones were admitted, so drafts only take what is left of the step: token budget
(within ``speculative_token_share`` of it, so a large batch does not draft), and only while
that many empty pages are free (a draft does not reclaim cached prefix pages, nor preempt).
Admission is over when drafts reserve their slots: no request of this step can take a prefix
hit on a page holding drafted tokens, and postprocess takes every rejected draft's slot back
before the step ends (:mod:`pagedattn.engine.step_postprocess`), so such a page never enters
the prefix index or the persistent tier.

How many each sequence drafts follows the match behind its drafts, its own acceptance at such
matches and the step's size (:mod:`pagedattn.engine.spec.policy`): the number that makes the
step's expected tokens per unit of time largest, none at all where speculation would slow the
step down.
"""

from __future__ import annotations

import dataclasses
import weakref

from pagedattn.cache import CacheManager
from pagedattn.config import SchedulerConfig
from pagedattn.engine.scheduled_batch import ScheduledSeq
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.spec.ngram import NgramIndex
from pagedattn.engine.spec.policy import DraftState


class Drafter:
    """Plans the drafts of each step and adapts each sequence's draft length.

    Args:
        config: the scheduler config (``speculative`` set, its n-gram and budget options).
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._states: weakref.WeakKeyDictionary[Sequence, DraftState] = weakref.WeakKeyDictionary()

    def state(self, seq: Sequence) -> DraftState:
        """The sequence's speculation state (created on first use, dropped with it)."""
        state = self._states.get(seq)
        if state is None:
            c = self.config
            state = DraftState(NgramIndex(c.ngram_min, c.ngram_max))
            self._states[seq] = state
        return state

    @staticmethod
    def eligible(item: ScheduledSeq) -> bool:
        """A decode step of a sequence that may draft: it samples its next token from its
        last one, has no logits processor (whose state a rejected draft
        would have advanced), and did not opt out."""
        seq = item.seq
        p = seq.params
        return (
            item.samples
            and item.num_new_tokens == 1
            and not item.draft_token_ids
            and item.start == seq.num_tokens - 1
            and seq.num_generated_tokens >= 1
            and not p.logits_processors
            and p.speculative_decoding == "auto"
            and not seq.needs_prompt_logits
        )

    @staticmethod
    def room(seq: Sequence) -> int:
        """Most drafts that can still be kept: the tokens it may still generate, minus the
        one every step samples anyway (so its KV never outgrows plain decoding's)."""
        left = seq.params.max_tokens - seq.num_generated_tokens - 1
        if seq.max_model_len is not None:
            left = min(left, seq.max_model_len - seq.num_tokens - 1)
        return left

    def draft(self, scheduled: list[ScheduledSeq], budget: int, cache: CacheManager) -> None:
        """Give eligible sequences of this step their drafts, in batch order, replacing their
        entries of ``scheduled`` (their draft slots reserved in ``cache``).

        Args:
            scheduled: the step's sequences so far (updated in place).
            budget: tokens left in the step's budget.
            cache: the page tables (drafts are appended after each sequence's step token).
        """
        c = self.config
        share = int(c.speculative_token_share * c.max_num_batched_tokens)
        left = min(budget, share - sum(s.num_new_tokens for s in scheduled))
        rows = sum(1 for s in scheduled if s.num_new_tokens == 1)  # the step's decode rows
        for i, item in enumerate(scheduled):
            if left <= 0:
                return
            if not self.eligible(item):
                continue
            seq = item.seq
            state = self.state(seq)
            most = min(c.num_speculative_tokens, left, self.room(seq))
            proposal = state.index.lookup(seq.token_ids, most)
            k = state.num_tokens(
                proposal.match_len, len(proposal.token_ids), seq.num_tokens, rows,
                c.speculative_row_cost,
            )  # fmt: skip
            tokens = proposal.token_ids[:k]
            if not tokens:
                continue
            if not cache.can_draft(seq.seq_id, len(tokens)):
                continue  # drafts take empty pages only
            # no window trimming: the step token's own query still sees the oldest window page
            slots = cache.append_slots(seq.seq_id, tokens, trim=False)
            scheduled[i] = dataclasses.replace(
                item, draft_token_ids=tuple(tokens), draft_slot_mapping=slots
            )
            state.match_len = proposal.match_len
            left -= len(tokens)
            rows += len(tokens)

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """Count a verify of ``seq`` that accepted ``num_accepted`` of ``num_drafted`` drafts."""
        self.state(seq).record(num_drafted, num_accepted)
