"""Scheduler: continuous batching with a token budget, chunked prefill, prefix caching and
preemption by recompute.

The shape follows vLLM v1's scheduler (``vllm/v1/core/sched/scheduler.py``; Yu et al., "Orca",
OSDI 2022 for iteration-level batching; Agrawal et al., "Sarathi-Serve", OSDI 2024 for chunked
prefill mixed with decodes). Each sequence only tracks ``num_computed_tokens``; each step:

1. running sequences, oldest first, get their next piece: 1 token for a decode, for a prompt
   the tokens up to the next multiple of ``prefill_chunk_size`` (vLLM's long-prefill
   threshold: a long prompt never takes more than that from the streams, and its chunk
   boundaries depend only on its own length). A piece larger than the budget left waits for a
   later step. When pages run out the newest running sequence is preempted: its pages are
   freed, it goes back to the front of the waiting queue with its generated tokens and is
   recomputed later, reusing whatever of its prefix is still cached. The newest running
   sequence shrinks its chunk to the pages left instead of preempting itself when it can
   still make progress.
2. if nothing was preempted, waiting sequences are admitted in arrival order while sequences,
   budget and pages allow; each reuses every full cached page of its prefix. A resumed
   (preempted) sequence takes its arrival-order place in the running list, so it runs, and
   is preempted, as the older request it is.

Every phase of a step commits or rolls back. :meth:`Scheduler.schedule` that raises gives
back every reservation it made (the sequences are as before the call). After the model ran,
:meth:`Scheduler.postprocess` first commits the step's KV (:meth:`Scheduler.commit_written`,
the only point where pages enter the prefix index), then applies each request's tokens; a
request whose part of that raises finishes alone with an error. A step whose forward raised is
failed instead (:meth:`Scheduler.fail_step`): only its requests end, with an error, and nothing
they reserved was ever made visible.

A request that can never fit is rejected at once (see :meth:`Scheduler.add`). A request with
``n`` / ``best_of`` > 1 is one prefill; when its sequence samples its first token it forks
into the request's other sequences, which then run as independent sequences (see
:mod:`pagedattn.engine.forks`: shared full pages, the partial last page copied in that step).
A sequence asking for prompt logprobs skips the prefix cache (a cached page has no logits).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Collection

from pagedattn.cache import CacheManager
from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.capacity import rejection, request_pages
from pagedattn.engine.forks import CopyPages, fork_children
from pagedattn.engine.logprobs import TokenLogprobs
from pagedattn.engine.outputs import FINISH_ABORT, FINISH_ERROR, RequestOutput
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
        copy_pages: applies a fork's page copies to the KV (:meth:`PagePool.copy_pages`);
            None = requests with ``n`` / ``best_of`` > 1 fail when they fork.
    """

    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        cache_manager: CacheManager,
        eos_token_ids: Collection[int],
        max_model_len: int | None,
        copy_pages: CopyPages | None = None,
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
        self.copy_pages = copy_pages

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
        """Pick this step's tokens and reserve their KV slots (see the module doc).

        Raises:
            Whatever the cache raises (a bug): every reservation of this call is given back
            first and every admitted sequence waits again where it was; preemptions stand
            (each is complete on its own).
        """
        scheduled: list[ScheduledSeq] = []
        admitted: list[Sequence] = []
        try:
            self._schedule(scheduled, admitted)
            page_tables = self.cache.page_tables([s.seq.seq_id for s in scheduled])
        except BaseException:
            self._roll_back(scheduled, admitted)
            raise
        now = time.monotonic()
        for seq in admitted:  # visible once the whole batch was reserved
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
                seq.num_cached_tokens = seq.num_computed_tokens
                self.stats.num_prompt_tokens += seq.num_prompt_tokens
                self.stats.prefix_cache_queries += seq.num_prompt_tokens
                self.stats.prefix_cache_hits += seq.num_computed_tokens
        return ScheduledBatch(seqs=scheduled, page_tables=page_tables)

    def _schedule(self, scheduled: list[ScheduledSeq], admitted: list[Sequence]) -> None:
        budget = self.config.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._piece(seq)
            if n > budget:  # waits for a step with room for its whole chunk
                i += 1
                continue
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
                seq = self.waiting[0]
                n = self._admit(seq, budget)
                if n == 0:
                    break
                admitted.append(seq)
                scheduled.append(self._reserve(seq, n))
                budget -= n

    def _roll_back(self, scheduled: list[ScheduledSeq], admitted: list[Sequence]) -> None:
        """Undo a :meth:`schedule` that raised, newest reservation first."""
        for item in reversed(scheduled):
            if item.seq not in admitted:
                self.cache.unreserve(item.seq.seq_id, item.seq.num_computed_tokens)
        for seq in reversed(admitted):
            if seq.seq_id in self.cache:
                self.cache.free_sequence(seq.seq_id)
            if seq in self.running:
                self.running.remove(seq)
                self.waiting.appendleft(seq)
            seq.status = SequenceStatus.WAITING
            seq.num_computed_tokens = 0

    def commit_written(self, batch: ScheduledBatch) -> None:
        """The step's commit point: its forward succeeded, so every scheduled sequence's KV is
        written up to its new ``num_computed_tokens`` and its full pages enter the prefix index
        (:meth:`CacheManager.commit_written`). Called by :meth:`postprocess`, never for a
        failed step."""
        for item in batch.seqs:
            seq = item.seq
            start = seq.num_computed_tokens
            seq.num_computed_tokens += item.num_new_tokens
            self.cache.commit_written(seq.seq_id, seq.num_computed_tokens)
            # write-through of the full pages it completed (a no-op without a tier)
            self.cache.pages_computed(seq.seq_id, start, seq.num_computed_tokens)

    def postprocess(self, batch: ScheduledBatch, out: SamplerOutput) -> list[RequestOutput]:
        """Commit the step (:meth:`commit_written`), record prompt logprobs, fork, append
        sampled tokens, finish and free.

        A request whose own row failed (``out.errors``) or whose token cannot be turned into
        text (a detokenizer or stop-string error) finishes with reason "error" and that
        message; the other requests are unaffected.

        The step's forward succeeded, so the full pages it completed also go to the persistent
        tier (:meth:`CacheManager.pages_computed`) before any sequence is freed.

        Args:
            batch: what :meth:`schedule` returned.
            out: the runner's output for it (one token per ``batch.sample_rows`` entry).

        Returns:
            Outputs finished outside the step (rejections, aborts, failed steps) first, then
            one delta per request that changed this step, in batch order.

        Raises:
            ValueError: ``out.token_ids`` of the wrong length.
        """
        rows = batch.sample_rows
        if len(out.token_ids) != len(rows):
            raise ValueError(f"token_ids: expected ({len(rows)},) ids, got {len(out.token_ids)}")
        self.commit_written(batch)
        now = time.monotonic()
        outputs = self.take_pending()
        logprobs = out.logprobs or [None] * len(rows)
        row = 0
        touched: dict[str, SequenceGroup] = {}
        for item in batch.seqs:
            seq, first_row = item.seq, row
            row += (1 + len(seq.fork_children)) if item.samples else 0
            group = self._requests.get(seq.request_id)
            if group is None or seq.is_finished:  # its request failed earlier in this loop
                continue
            touched[seq.request_id] = group
            try:
                self._apply(item, group, out, logprobs, first_row, now)
            except Exception as exc:  # this request's bookkeeping, not the step's
                self._fail_group(group, f"{type(exc).__name__}: {exc}", now)
        for group in touched.values():
            delta = group.take_output()
            if delta is not None:
                outputs.append(delta)
        if batch.seqs:
            self.stats.record_step(len(batch.seqs), batch.num_tokens)
        return outputs

    def _apply(
        self,
        item: ScheduledSeq,
        group: SequenceGroup,
        out: SamplerOutput,
        logprobs: list[TokenLogprobs | None],
        row: int,
        now: float,
    ) -> None:
        """One scheduled sequence's share of :meth:`postprocess`: prompt logprobs, its fork,
        the sampled tokens (from ``row`` on), finishing and freeing."""
        seq = item.seq
        if seq.seq_id in out.prompt_logprobs:
            seq.add_prompt_logprobs(*out.prompt_logprobs[seq.seq_id])
        if not item.samples:
            if seq.num_computed_tokens == seq.num_tokens and seq.params.max_tokens == 0:
                seq.finish("length", now)  # prompt logprobs only
                group.finish_unforked("length", now)
                self._retire(seq, group)
            return
        children, seq.fork_children = seq.fork_children, []
        if children:
            if self.copy_pages is None:
                raise ValueError("n / best_of > 1: this scheduler has no copy_pages")
            new = fork_children(seq, children, self.cache, self.copy_pages)
            for child in new.running:
                bisect.insort(self.running, child, key=lambda s: s.seq_id)
            self.waiting.extendleft(reversed(new.waiting))
        for s in (seq, *children):  # a waiting child keeps its token and is recomputed
            token_id = int(out.token_ids[row])
            error = out.errors.get(row)
            if error is None:
                try:
                    s.append_token(token_id, self.eos_token_ids, now, logprobs[row])
                    self.stats.num_generation_tokens += 1
                except Exception as exc:  # this request's text, not the step's
                    error = f"token {token_id}: {type(exc).__name__}: {exc}"
            row += 1
            if error is not None:
                s.finish(FINISH_ERROR, now, error=error)
            if s.is_finished:
                self._retire(s, group)

    def _fail_group(self, group: SequenceGroup, error: str, now: float) -> None:
        """Finish every unfinished sequence of a request with reason "error" and free it."""
        group.finish_unforked(FINISH_ERROR, now, error=error)
        for seq in group.seqs:
            if not seq.is_finished:
                seq.finish(FINISH_ERROR, now, error=error)
                self._retire(seq, group)

    def fail_step(self, batch: ScheduledBatch, error: str) -> None:
        """The step's forward raised: finish each of its requests (every sequence of it) with
        reason "error".

        Nothing is rolled back because nothing was committed: the pages they reserved this
        step never entered the prefix index and go back to the pool as empty pages. Their
        final outputs come from the next :meth:`postprocess` or :meth:`take_pending`.
        """
        now = time.monotonic()
        for request_id in dict.fromkeys(item.seq.request_id for item in batch.seqs):
            group = self._requests.get(request_id)
            if group is None:
                continue
            self._fail_group(group, error, now)
            out = group.take_output()
            if out is not None:
                self._pending.append(out)

    def take_pending(self) -> list[RequestOutput]:
        """Outputs of requests finished outside a step (rejections, aborts, failed steps)."""
        outputs, self._pending = self._pending, []
        return outputs

    # ---- internals -------------------------------------------------------------------------
    def _reserve(self, seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        slots = self.cache.append_slots(seq.seq_id, seq.token_ids[start : start + n])
        samples = start + n == seq.num_tokens and seq.params.max_tokens > 0
        return ScheduledSeq(seq, n, slots, samples=samples)

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

    def _piece(self, seq: Sequence, start: int | None = None) -> int:
        """Tokens the sequence computes next: to its end, or to the next chunk boundary (a
        multiple of ``prefill_chunk_size``) when chunked prefill is on or it resumes."""
        start = seq.num_computed_tokens if start is None else start
        if not self.config.enable_chunked_prefill and seq.num_preemptions == 0:
            return seq.num_tokens - start
        chunk = self.config.prefill_chunk_size
        return min(seq.num_tokens, (start // chunk + 1) * chunk) - start

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Move the first waiting sequence to running with its prefix-cache hits; returns the
        tokens it computes this step, 0 (and nothing changed) when it does not fit."""
        # Prompt logprobs need every prompt row's logits: no prefix cache hit then.
        lookup = () if seq.needs_prompt_logits else seq.token_ids
        num_cached = self.cache.add_sequence(seq.seq_id, lookup)
        try:
            n = self._piece(seq, num_cached)
            whole = not self.config.enable_chunked_prefill and seq.num_preemptions == 0
            alone = n <= budget and not self.running and not whole
            if alone and not self.cache.can_append(seq.seq_id, n):
                n = self._fitting_chunk(seq, n)  # alone: progress in smaller chunks
            if n > budget or n == 0 or not self.cache.can_append(seq.seq_id, n):
                n = 0
        except BaseException:
            self.cache.free_sequence(seq.seq_id)
            raise
        if n == 0:
            self.cache.free_sequence(seq.seq_id)
            return 0
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_cached
        # arrival order (seq ids grow with arrival): a resumed sequence is older than the
        # requests admitted while it waited
        bisect.insort(self.running, seq, key=lambda s: s.seq_id)
        return n

    def _preempt(self, seq: Sequence) -> None:
        self.cache.free_sequence(seq.seq_id)
        seq.preempt()
        self.waiting.appendleft(seq)
        self.stats.num_preemptions += 1
