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

A request that can never fit is rejected at once (see :meth:`Scheduler.add`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection

import numpy as np

from pagedattn.cache import CacheManager
from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.outputs import FINISH_ABORT, REJECT_CAPACITY, REJECT_CONTEXT, RequestOutput
from pagedattn.engine.scheduled_batch import ScheduledBatch, ScheduledSeq
from pagedattn.engine.sequence import Sequence, SequenceStatus
from pagedattn.engine.stats import SchedulerStats


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
        self._requests: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # finished outside a step (reject, abort)

    # ---- requests --------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a sequence, or finish it at once.

        Rejected with ``context_length_exceeded``: a prompt that leaves no room for one token
        under ``max_model_len``, or (chunked prefill off) a prompt longer than
        ``max_num_batched_tokens``. Rejected with ``cache_capacity_exceeded``: its K/V alone,
        at its largest (prompt + max_tokens - 1 tokens, or the window bound), would need more
        pages than the pool holds. ``max_tokens == 0`` finishes with "length" at once.
        The outcome is returned by the next :meth:`postprocess`.

        Raises:
            ValueError: the request id is already in use.
        """
        if seq.request_id in self._requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in use")
        now = time.monotonic()
        reason = self._rejection(seq)
        if reason is not None or seq.params.max_tokens == 0:
            if reason is None:
                seq.finish("length", now)
            else:
                seq.finish(reason[0], now, error=reason[1])
            self._finish_outside_step(seq)
            return
        self._requests[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Finish a request with "abort" wherever it is, freeing its pages exactly once.

        Returns:
            True when the request was waiting or running; False when unknown or finished.
        """
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.cache.free_sequence(seq.seq_id)
        else:
            self.waiting.remove(seq)
        seq.finish(FINISH_ABORT, time.monotonic())
        self._finish_outside_step(seq)
        return True

    def get(self, request_id: str) -> Sequence | None:
        """The waiting or running sequence of a request, None when unknown or finished."""
        return self._requests.get(request_id)

    def has_unfinished(self) -> bool:
        """True while a request is waiting or running, or an output is still to be returned."""
        return bool(self.waiting or self.running or self._pending)

    def max_pages_per_seq(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """Most pages one request can hold at once (its K/V alone, smallest chunks allowed)."""
        kv_tokens = num_prompt_tokens + max_tokens - 1
        if self.max_model_len is not None:
            kv_tokens = min(kv_tokens, self.max_model_len - 1)
        ps = self.cache_config.page_size
        need = _cdiv(max(kv_tokens, num_prompt_tokens), ps)
        w = self.cache_config.sliding_window
        if w is not None:
            chunk = 1 if self.config.enable_chunked_prefill else num_prompt_tokens
            sink_pages = _cdiv(self.cache_config.num_sink_tokens, ps)
            need = min(need, sink_pages + _cdiv(w + chunk - 2, ps) + 1)
        return need

    def _rejection(self, seq: Sequence) -> tuple[str, str] | None:
        n, limit = seq.num_prompt_tokens, self.max_model_len
        if limit is not None and n + min(1, seq.params.max_tokens) > limit:
            return REJECT_CONTEXT, f"prompt has {n} tokens; max_model_len is {limit}"
        budget = self.config.max_num_batched_tokens
        if not self.config.enable_chunked_prefill and n > budget:
            return REJECT_CONTEXT, (
                f"prompt has {n} tokens > max_num_batched_tokens={budget} and chunked "
                "prefill is off"
            )
        need = self.max_pages_per_seq(n, seq.params.max_tokens)
        if need > self.cache.num_pages:
            return REJECT_CAPACITY, (
                f"needs {need} pages of {self.cache_config.page_size} tokens; the pool has "
                f"{self.cache.num_pages}"
            )
        return None

    def _finish_outside_step(self, seq: Sequence) -> None:
        assert seq.finish_reason is not None
        self.stats.num_finished[seq.finish_reason] += 1
        self._pending.append(seq.take_output())

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
        return ScheduledBatch(seqs=scheduled, page_tables=page_tables)

    def postprocess(self, batch: ScheduledBatch, token_ids: np.ndarray) -> list[RequestOutput]:
        """Advance the scheduled sequences, append sampled tokens, finish and free.

        The step's forward succeeded, so the full pages it completed go to the persistent tier
        (:meth:`CacheManager.pages_computed`) before any sequence is freed.

        Args:
            batch: what :meth:`schedule` returned.
            token_ids: (len(batch.sampling_seqs),) int sampled ids, in batch order.

        Returns:
            Outputs finished outside the step (rejections, aborts) first, then one output per
            sequence that sampled a token, in batch order.

        Raises:
            ValueError: ``token_ids`` of the wrong length.
        """
        if len(token_ids) != len(batch.sampling_seqs):
            raise ValueError(
                f"token_ids: expected ({len(batch.sampling_seqs)},) ids, got {len(token_ids)}"
            )
        now = time.monotonic()
        outputs, self._pending = self._pending, []
        sampled = iter(int(t) for t in token_ids)
        for item in batch.seqs:
            seq = item.seq
            start = seq.num_computed_tokens
            seq.num_computed_tokens += item.num_new_tokens
            self.cache.pages_computed(seq.seq_id, start, seq.num_computed_tokens)  # the tier
            if not item.samples:
                continue
            seq.append_token(next(sampled), self.eos_token_ids, now)
            self.stats.num_generation_tokens += 1
            if seq.is_finished:
                self.running.remove(seq)
                self.cache.free_sequence(seq.seq_id)
                del self._requests[seq.request_id]
                assert seq.finish_reason is not None
                self.stats.num_finished[seq.finish_reason] += 1
            outputs.append(seq.take_output())
        if batch.seqs:
            self.stats.record_step(len(batch.seqs), batch.num_tokens)
        return outputs

    # ---- internals -------------------------------------------------------------------------
    def _reserve(self, seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        slots = self.cache.append_slots(seq.seq_id, seq.token_ids[start : start + n])
        return ScheduledSeq(seq, n, slots, samples=start + n == seq.num_tokens)

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
        num_cached = self.cache.add_sequence(seq.seq_id, seq.token_ids)
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
