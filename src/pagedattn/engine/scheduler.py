"""Scheduler: continuous batching with a token budget, chunked prefill, prefix caching and
preemption by recompute.

The shape follows vLLM v1's scheduler (``vllm/v1/core/sched/scheduler.py``; Yu et al., "Orca",
OSDI 2022 for iteration-level batching; Agrawal et al., "Sarathi-Serve", OSDI 2024 for chunked
prefill mixed with decodes). Each sequence only tracks ``num_computed_tokens``; each step:

1. running sequences, oldest first, get ``min(uncomputed tokens, budget left)`` new tokens
   (1 for a decode, a chunk for a prompt). When pages run out the newest running sequence is
   preempted: its pages are freed, it goes back to the front of the waiting queue with its
   generated tokens and is recomputed later, reusing whatever of its prefix is still cached.
   The newest running sequence shrinks its chunk to the pages left instead of preempting itself
   when it can still make progress.
2. if nothing was preempted, waiting sequences are admitted in arrival order while sequences,
   budget and pages allow; each reuses every full cached page of its prefix.

A request that can never fit is rejected at once (see :meth:`Scheduler.add`). A request with
``n`` / ``best_of`` > 1 is one prefill; when its sequence samples its first token it forks
(``CacheManager.fork``: shared full pages, the partial last page copied by the next step's runner)
into the request's other sequences, which then run as independent sequences. A child that finds
no page for its copy starts waiting, like a preempted sequence (recomputed, prefix cache hits).
A sequence asking for prompt logprobs skips the prefix cache (a cached page has no logits).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection

from pagedattn.cache import CacheManager, OutOfPagesError
from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.capacity import rejection, request_pages
from pagedattn.engine.outputs import FINISH_ABORT, RequestOutput
from pagedattn.engine.sampler_output import SamplerOutput
from pagedattn.engine.scheduled_batch import ScheduledBatch, ScheduledSeq
from pagedattn.engine.sequence import Sequence, SequenceStatus
from pagedattn.engine.sequence_group import SequenceGroup
from pagedattn.engine.stats import SchedulerStats


class Scheduler:
    """Decides which tokens each step computes, and applies each step's sampled tokens.

    Args:
        cache_config: page size, window and sinks (must match ``cache_manager``).
        scheduler_config: sequence and token budgets, chunked prefill.
        cache_manager: the page tables (its pool size bounds what fits).
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        max_model_len: most tokens (prompt + generated) per request, None = unbounded.
    """

    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        cache_manager: CacheManager,
        eos_token_ids: Collection[int],
        max_model_len: int | None,
    ) -> None:
        self.cache_config = cache_config
        self.config = scheduler_config
        self.cache = cache_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self._requests: dict[str, SequenceGroup] = {}
        self._pending: list[RequestOutput] = []  # finished outside a step (reject, abort)
        self._page_copies: list[tuple[int, int]] = []  # forks of the last step, for the next

    # ---- requests --------------------------------------------------------------------------
    def add(self, group: SequenceGroup) -> None:
        """Queue a request (its parent sequence), or finish it at once.

        Rejected with ``context_length_exceeded``: a prompt that leaves no room for one token
        under ``max_model_len``, or (chunked prefill off) a prompt longer than
        ``max_num_batched_tokens``. Rejected with ``cache_capacity_exceeded``: its K/V alone,
        at its largest (prompt + max_tokens - 1 tokens, or the window bound), would need more
        pages than the pool holds (every completion counted, the prompt's full pages once).
        ``max_tokens == 0`` finishes with "length" at once (after the prompt when prompt
        logprobs are asked).
        The outcome is returned by the next :meth:`postprocess`.

        Raises:
            ValueError: the request id is already in use.
        """
        seq = group.parent
        if seq.request_id in self._requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in use")
        now = time.monotonic()
        reason = self._rejection(seq)
        at_once = seq.params.max_tokens == 0 and seq.params.prompt_logprobs is None
        if reason is not None or at_once:
            if reason is None:
                seq.finish("length", now)
                group.finish_unforked("length", now)
            else:
                seq.finish(reason[0], now, error=reason[1])
                group.finish_unforked(reason[0], now, error=reason[1])
            self._finish_outside_step(group)
            return
        self._requests[seq.request_id] = group
        self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Finish a request with "abort" wherever it is, freeing its pages exactly once.

        Returns:
            True when the request was waiting or running; False when unknown or finished.
        """
        group = self._requests.pop(request_id, None)
        if group is None:
            return False
        now = time.monotonic()
        group.finish_unforked(FINISH_ABORT, now)
        for seq in group.seqs:
            if seq.is_finished:
                continue
            if seq.status is SequenceStatus.RUNNING:
                self.running.remove(seq)
                self.cache.free_sequence(seq.seq_id)
            else:
                self.waiting.remove(seq)
            seq.finish(FINISH_ABORT, now)
        self._finish_outside_step(group)
        return True

    def get(self, request_id: str) -> Sequence | None:
        """The parent sequence of a waiting or running request, None when unknown/finished."""
        group = self._requests.get(request_id)
        return None if group is None else group.parent

    def has_unfinished(self) -> bool:
        """True while a request is waiting or running, or an output is still to be returned."""
        return bool(self.waiting or self.running or self._pending)

    def max_pages_per_seq(
        self, num_prompt_tokens: int, max_tokens: int, num_completions: int = 1
    ) -> int:
        """Most pages one request can hold at once (:func:`capacity.request_pages`)."""
        return request_pages(
            self.cache_config,
            self.config,
            self.max_model_len,
            num_prompt_tokens,
            max_tokens,
            num_completions,
        )

    def _rejection(self, seq: Sequence) -> tuple[str, str] | None:
        p = seq.params
        return rejection(
            self.cache_config,
            self.config,
            self.max_model_len,
            self.cache.num_pages,
            seq.num_prompt_tokens,
            p.max_tokens,
            p.num_completions,
        )

    def _finish_outside_step(self, group: SequenceGroup) -> None:
        reason = group.parent.finish_reason
        assert reason is not None
        self.stats.num_finished[reason] += 1
        out = group.take_output()
        if out is not None:
            self._pending.append(out)

    # ---- one step --------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Pick this step's tokens and reserve their KV slots (see the module doc)."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.cache.can_append(seq.seq_id, n) and seq is not self.running[-1]:
                self._preempt(self.running.pop())
                preempted = True
            if not self.cache.can_append(seq.seq_id, n):
                n = self._fitting_chunk(seq, n)
                if n == 0:  # the newest sequence, and not even one token fits
                    self._preempt(self.running.pop())
                    preempted = True
                    break
            scheduled.append(self._reserve(seq, n))
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
                item = self._admit(self.waiting[0], budget)
                if item is None:
                    break
                scheduled.append(item)
                budget -= item.num_new_tokens
        page_tables = self.cache.page_tables([s.seq.seq_id for s in scheduled])
        copies, self._page_copies = self._page_copies, []
        return ScheduledBatch(seqs=scheduled, page_tables=page_tables, page_copies=copies)

    def postprocess(self, batch: ScheduledBatch, out: SamplerOutput) -> list[RequestOutput]:
        """Advance the scheduled sequences, record prompt logprobs, fork, append sampled
        tokens, finish and free.

        Args:
            batch: what :meth:`schedule` returned.
            out: the runner's output for it (one token per ``batch.sample_rows`` entry).

        Returns:
            Outputs finished outside the step (rejections, aborts) first, then one delta per
            request that changed this step, in batch order.

        Raises:
            ValueError: ``out.token_ids`` of the wrong length.
        """
        rows = batch.sample_rows
        if len(out.token_ids) != len(rows):
            raise ValueError(f"token_ids: expected ({len(rows)},) ids, got {len(out.token_ids)}")
        now = time.monotonic()
        outputs, self._pending = self._pending, []
        logprobs = out.logprobs or [None] * len(rows)
        sampled = iter(zip(out.token_ids.tolist(), logprobs, strict=True))
        touched: dict[str, SequenceGroup] = {}
        for item in batch.seqs:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            if seq.seq_id in out.prompt_logprobs:
                seq.add_prompt_logprobs(*out.prompt_logprobs[seq.seq_id])
            group = self._requests[seq.request_id]
            if not item.samples:
                if seq.num_computed_tokens == seq.num_tokens and seq.params.max_tokens == 0:
                    seq.finish("length", now)  # prompt logprobs only
                    group.finish_unforked("length", now)
                    self._retire(seq, group)
                    touched[seq.request_id] = group
                continue
            children, seq.fork_children = seq.fork_children, []
            for s in (seq, *(self._fork(seq, c) for c in children)):
                token_id, lp = next(sampled)
                s.append_token(token_id, self.eos_token_ids, now, lp)
                self.stats.num_generation_tokens += 1
                if s.is_finished:
                    self._retire(s, group)
            touched[seq.request_id] = group
        for group in touched.values():
            delta = group.take_output()
            if delta is not None:
                outputs.append(delta)
        if batch.seqs:
            self.stats.record_step(len(batch.seqs), batch.num_tokens)
        return outputs

    # ---- internals -------------------------------------------------------------------------
    def _reserve(self, seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        slots = self.cache.append_slots(seq.seq_id, seq.token_ids[start : start + n])
        samples = start + n == seq.num_tokens and seq.params.max_tokens > 0
        return ScheduledSeq(seq, n, slots, samples=samples)

    def _fork(self, parent: Sequence, child: Sequence) -> Sequence:
        """Start ``child`` from ``parent``'s pages (copy-on-write of the partial last page);
        without a free page for the copy it waits and is recomputed like a preempted one."""
        try:
            self._page_copies.extend(self.cache.fork(parent.seq_id, child.seq_id))
        except OutOfPagesError:
            child.num_computed_tokens = 0
            child.status = SequenceStatus.WAITING
            self.waiting.appendleft(child)
            return child
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        return child

    def _retire(self, seq: Sequence, group: SequenceGroup) -> None:
        """Free a finished sequence; forget its request once every sequence finished."""
        if seq in self.running:
            self.running.remove(seq)
            self.cache.free_sequence(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if group.is_finished:
            del self._requests[seq.request_id]
            assert group.parent.finish_reason is not None
            self.stats.num_finished[group.parent.finish_reason] += 1

    def _fitting_chunk(self, seq: Sequence, n: int) -> int:
        """Largest chunk <= n that fits the free pages (binary search; 0 when none)."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.cache.can_append(seq.seq_id, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _admit(self, seq: Sequence, budget: int) -> ScheduledSeq | None:
        # Prompt logprobs need every prompt row's logits: no prefix cache hit then.
        lookup = () if seq.needs_prompt_logits else seq.token_ids
        num_cached = self.cache.add_sequence(seq.seq_id, lookup)
        n = seq.num_tokens - num_cached
        whole = not self.config.enable_chunked_prefill and seq.num_preemptions == 0
        if whole and n > budget:
            self.cache.free_sequence(seq.seq_id)
            return None
        n = min(n, budget)
        if not self.cache.can_append(seq.seq_id, n) and not self.running and not whole:
            n = self._fitting_chunk(seq, n)  # alone: progress in smaller chunks
        if n == 0 or not self.cache.can_append(seq.seq_id, n):
            self.cache.free_sequence(seq.seq_id)
            return None
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_cached
        self.running.append(seq)
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = time.monotonic()
            seq.num_cached_tokens = num_cached
            self.stats.num_prompt_tokens += seq.num_prompt_tokens
            self.stats.prefix_cache_queries += seq.num_prompt_tokens
            self.stats.prefix_cache_hits += num_cached
        return self._reserve(seq, n)

    def _preempt(self, seq: Sequence) -> None:
        self.cache.free_sequence(seq.seq_id)
        seq.preempt()
        self.waiting.appendleft(seq)
        self.stats.num_preemptions += 1
