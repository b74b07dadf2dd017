"""StepPlanner: which tokens a step computes, under a token budget and the free pages.

1. Running sequences, oldest first, get their next piece: 1 token for a decode, for a prompt
   the tokens up to its next chunk boundary (``SchedulerConfig.prefill_chunk_end``: chunks of
   ``prefill_chunk_size`` tokens, vLLM's long-prefill threshold, shortened as the context grows
   so that a late chunk's attention does not make its step longer; a long prompt never takes
   more than that from the streams, and its chunk boundaries depend only on its own positions).
   A piece larger than the budget left waits for a
   later step. When pages run out the newest running sequence is preempted: its pages are
   freed, it goes back to the front of the waiting queue with its generated tokens and is
   recomputed later, reusing whatever of its prefix is still cached. The newest running
   sequence shrinks its chunk to the pages left instead of preempting itself when it can
   still make progress.
2. If nothing was preempted, waiting sequences are admitted in arrival order while sequences,
   budget and pages allow; each reuses every full cached page of its prefix. A resumed
   (preempted) sequence takes its arrival-order place in the running list, so it runs, and
   is preempted, as the older request it is. A child request that waits for its sibling's
   prompt (:attr:`Sequence.waits_for_lead`: ``n`` / ``best_of`` > 1 with prefix caching on) is
   passed over, keeping its place, so that it is admitted once the prompt's full pages are in
   the prefix index and computes only the partial last page. With a persistent tier, a
   sequence whose prefix the tier may hold first waits for its KV
   (:mod:`pagedattn.engine.kv_restores`) as soon as it is next in the queue (so the read
   overlaps a wait for a seat or budget): it leaves the queue while the tier is read beside
   the steps, and comes back to its front when the records are in (or its deadline passed);
   its admission then copies them into the pool.

While any running sequence decodes, the step's prompt work is bounded too (:class:`PrefillRoom`):
its prompt pieces together may cost at most ``prefill_chunk_size`` tokens, a piece starting at
position ``s`` costing ``1 + s / prefill_attention_tokens`` per token (its attention over the
context), so two long prompts, or a late chunk and a new prompt, never share a step that the
decodes would wait on. The first prompt piece of a step always runs (progress); a piece that
does not fit waits whole for a later step, so chunk boundaries never move. Without decodes, a
step takes prompt pieces up to ``max_num_batched_tokens``.

Every reservation goes to the step's :class:`StepJournal`; a preemption is complete on its own
and stands even when the step is rolled back.
"""

from __future__ import annotations

import math

from pagedattn.cache import CacheManager
from pagedattn.config import SchedulerConfig
from pagedattn.engine.kv_restores import Begin
from pagedattn.engine.request_queues import RequestQueues, may_admit
from pagedattn.engine.scheduled_batch import ScheduledSeq
from pagedattn.engine.sequence import Sequence, SequenceStatus
from pagedattn.engine.spec.drafter import Drafter
from pagedattn.engine.stats import SchedulerStats
from pagedattn.engine.step_journal import StepJournal


class StepPlanner:
    """Chunk planning, preemption and admission for one step (see the module doc).

    Args:
        config: sequence and token budgets, chunked prefill.
        cache: the page tables; slots are reserved here.
        queues: the waiting and running sequences (changed in place).
        stats: counts preemptions.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        cache: CacheManager,
        queues: RequestQueues,
        stats: SchedulerStats,
    ) -> None:
        self.config = config
        self.cache = cache
        self.queues = queues
        self.stats = stats
        # speculative decoding: drafts planned after admission, verified as decode rows
        self.drafter = Drafter(config) if config.speculative else None

    def plan(self, journal: StepJournal) -> None:
        """Schedule the running sequences, then admit waiting ones, recording every
        reservation and admission in ``journal`` as it is made."""
        running, waiting, restores = self.queues.running, self.queues.waiting, self.queues.restores
        if restores is not None:
            for seq in reversed(restores.poll()):  # their KV is read: first in the queue
                seq.status = SequenceStatus.WAITING
                waiting.appendleft(seq)
        budget = self.config.max_num_batched_tokens
        room = PrefillRoom(self.config, decoding=any(map(is_decoding, running)))
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = self.piece(seq)
            if n > budget or not room.admits(seq, n):  # waits for room for its whole chunk
                i += 1
                continue
            while not self.cache.can_append(seq.seq_id, n) and seq is not running[-1]:
                self.preempt(running.pop())
                preempted = True
            if not self.cache.can_append(seq.seq_id, n):
                n = self.fitting_chunk(seq, n)
                if n == 0:  # the newest sequence, and not even one token fits
                    self.preempt(running.pop())
                    preempted = True
                    break
            room.take(seq, n)
            journal.scheduled.append(self.reserve(seq, n))
            budget -= n
            i += 1
        if not preempted:
            limit = self.config.max_num_seqs
            for seq in [s for s in waiting if not s.waits_for_lead]:
                if restores is not None:  # its read overlaps any wait for a seat or budget
                    begun = restores.begin(seq, lookup_tokens(seq))
                    if begun is Begin.BUSY:
                        break
                    if begun is Begin.STARTED:  # waits for its KV, in no queue
                        waiting.remove(seq)
                        seq.status = SequenceStatus.WAITING_FOR_KV
                        continue
                if not may_admit(len(running), limit) or budget <= 0:
                    break
                n = self.admit(seq, budget, room)
                if n == 0:
                    break
                room.take(seq, n)
                journal.admitted.append(seq)
                journal.scheduled.append(self.reserve(seq, n))
                budget -= n
        if self.drafter is not None and budget > 0:
            self.drafter.draft(journal.scheduled, budget, self.cache)

    def reserve(self, seq: Sequence, n: int) -> ScheduledSeq:
        """Reserve the KV slots of the sequence's next ``n`` tokens."""
        start = seq.num_computed_tokens
        slots = self.cache.append_slots(seq.seq_id, seq.token_ids[start : start + n])
        samples = start + n == seq.num_tokens and seq.params.max_tokens > 0
        return ScheduledSeq(seq, n, slots, samples=samples)

    def fitting_chunk(self, seq: Sequence, n: int) -> int:
        """Largest chunk <= n that fits the free pages (binary search; 0 when none)."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.cache.can_append(seq.seq_id, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def piece(self, seq: Sequence, start: int | None = None) -> int:
        """Tokens the sequence computes next: to its end, or to the next chunk boundary
        (``SchedulerConfig.prefill_chunk_end``) when chunked prefill is on or it resumes."""
        start = seq.num_computed_tokens if start is None else start
        if not self.config.enable_chunked_prefill and seq.num_preemptions == 0:
            return seq.num_tokens - start
        return min(seq.num_tokens, self.config.prefill_chunk_end(start)) - start

    def admit(self, seq: Sequence, budget: int, room: PrefillRoom) -> int:
        """Move a waiting sequence to running with its prefix-cache hits; returns the
        tokens it computes this step, 0 (and nothing changed) when it does not fit the budget,
        the step's prefill room or the pages."""
        restores = self.queues.restores
        fetched = None if restores is None else restores.records(seq)
        num_cached = self.cache.add_sequence(seq.seq_id, lookup_tokens(seq), fetched=fetched)
        try:
            n = self.piece(seq, num_cached)
            whole = not self.config.enable_chunked_prefill and seq.num_preemptions == 0
            alone = n <= budget and not self.queues.running and not whole
            if alone and not self.cache.can_append(seq.seq_id, n):
                n = self.fitting_chunk(seq, n)  # alone: progress in smaller chunks
            fits = 0 < n <= budget and room.admits(seq, n, start=num_cached)
            if not fits or not self.cache.can_append(seq.seq_id, n):
                n = 0
        except BaseException:
            self.cache.free_sequence(seq.seq_id)
            raise
        if n == 0:
            self.cache.free_sequence(seq.seq_id)
            return 0
        self.queues.waiting.remove(seq)
        if restores is not None:
            restores.admitted(seq)
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_cached
        self.queues.insert_running(seq)
        return n

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and queue it first, to be recomputed."""
        self.cache.free_sequence(seq.seq_id)
        seq.preempt()
        self.queues.waiting.appendleft(seq)
        self.stats.num_preemptions += 1


def lookup_tokens(seq: Sequence) -> list[int] | tuple[()]:
    """What a sequence's admission looks up in the prefix cache: its tokens, none when it asks
    for prompt logprobs (every prompt row's logits: no hit then)."""
    return () if seq.needs_prompt_logits else seq.token_ids


def is_decoding(seq: Sequence) -> bool:
    """Whether the running sequence's next piece is one decode token (its prompt and every
    generated token but the last are computed)."""
    return seq.num_tokens - seq.num_computed_tokens == 1 and seq.num_tokens > seq.num_prompt_tokens


class PrefillRoom:
    """The prompt work a step may still take beside its decodes (see the module doc).

    Args:
        config: ``prefill_chunk_size`` and the attention weight of a piece.
        decoding: whether a running sequence decodes this step; without one the room is
            unbounded (the token budget alone applies).
    """

    def __init__(self, config: SchedulerConfig, decoding: bool) -> None:
        self.config = config
        self.left = float(config.prefill_chunk_size) if decoding else math.inf
        self.taken = False

    def admits(self, seq: Sequence, n: int, start: int | None = None) -> bool:
        """Whether the piece of ``n`` tokens from ``start`` (default: the sequence's computed
        tokens) fits: a decode always does, so does the step's first prompt piece."""
        start = seq.num_computed_tokens if start is None else start
        if not self.taken or self._is_decode(seq, start, n):
            return True
        return self.config.prefill_cost(start, n) <= self.left

    def take(self, seq: Sequence, n: int) -> None:
        """Count the piece of ``n`` tokens the sequence was just given (before its reserve)."""
        start = seq.num_computed_tokens
        if not self._is_decode(seq, start, n):
            self.left -= self.config.prefill_cost(start, n)
            self.taken = True

    @staticmethod
    def _is_decode(seq: Sequence, start: int, n: int) -> bool:
        return n == 1 and start == seq.num_tokens - 1 and seq.num_tokens > seq.num_prompt_tokens
