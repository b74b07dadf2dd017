"""Scheduler: continuous batching with a token budget, chunked prefill, prefix caching and
preemption by recompute.

The shape follows vLLM v1's scheduler (``vllm/v1/core/sched/scheduler.py``; Yu et al., "Orca",
OSDI 2022 for iteration-level batching; Agrawal et al., "Sarathi-Serve", OSDI 2024 for chunked
prefill mixed with decodes). Each sequence only tracks ``num_computed_tokens``. The scheduler
coordinates four parts:

- :mod:`~pagedattn.engine.request_queues`: the waiting and running sequences and the live
  requests; retiring a finished sequence frees its pages once.
- :mod:`~pagedattn.engine.step_planner`: each step's tokens: running sequences' next pieces
  (decode or prefill chunk), preemption when pages run out, admission of waiting sequences
  with their prefix-cache hits.
- :mod:`~pagedattn.engine.step_journal`: the reservations of one :meth:`Scheduler.schedule`.
- :mod:`~pagedattn.engine.step_plan`: the frozen plan the step hands the model runner
  (:func:`~pagedattn.engine.step_plan.build_plan` lays out the logits rows, once).
- :mod:`~pagedattn.engine.step_postprocess`: applies the runner's output, keyed by request id,
  to the requests: sampled tokens, stop checks, each request's commit point (the only point
  where pages enter the prefix index) and retirement.

Every phase of a step commits or rolls back. :meth:`Scheduler.schedule` that raises gives
back every reservation it made (the sequences are as before the call). After the model ran,
:meth:`Scheduler.postprocess` applies each request's share of the output; a request whose part
of that raises finishes alone with an error. A step whose forward raised is
failed instead (:meth:`Scheduler.fail_step`): only its requests end, with an error, and nothing
they reserved was ever made visible.

A request that can never fit is rejected at once (see :meth:`Scheduler.add`). Every request
here is one sequence with one completion: ``n`` / ``best_of`` > 1 arrive as child requests of a
parent (:mod:`pagedattn.engine.parent_request`), which share the prompt's full pages through
the prefix cache. A sequence asking for prompt logprobs skips the prefix cache (a cached page
has no logits).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection

from pagedattn.cache import CacheManager
from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.capacity import rejection, request_pages
from pagedattn.engine.kv_restores import KVRestores
from pagedattn.engine.outputs import FINISH_ABORT, RequestOutput
from pagedattn.engine.request_queues import RequestQueues
from pagedattn.engine.sequence import Sequence, SequenceStatus
from pagedattn.engine.stats import SchedulerStats
from pagedattn.engine.step_journal import StepJournal
from pagedattn.engine.step_output import StepOutput
from pagedattn.engine.step_plan import StepPlan, build_plan
from pagedattn.engine.step_planner import StepPlanner
from pagedattn.engine.step_postprocess import StepPostprocessor, check_output


class Scheduler:
    """Decides which tokens each step computes, and applies each step's sampled tokens.

    Args:
        cache_config: page size, window and sinks (must match ``cache_manager``).
        scheduler_config: sequence and token budgets, chunked prefill.
        cache_manager: the page tables (its pool size bounds what fits).
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        max_model_len: most tokens (prompt + generated) per request, None = unbounded.
        restores: the persistent tier's restores (requests waiting for KV), None without one.
    """

    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        cache_manager: CacheManager,
        eos_token_ids: Collection[int],
        max_model_len: int | None,
        restores: KVRestores | None = None,
    ) -> None:
        self.cache_config = cache_config
        self.config = scheduler_config
        self.cache = cache_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.stats = SchedulerStats()
        self.queues = RequestQueues(cache_manager, self.stats, restores)
        self.planner = StepPlanner(scheduler_config, cache_manager, self.queues, self.stats)
        self.postprocessor = StepPostprocessor(
            cache_manager, self.queues, self.stats, self.eos_token_ids, self.planner.drafter
        )

    @property
    def waiting(self) -> deque[Sequence]:
        """Sequences to admit, front first."""
        return self.queues.waiting

    @property
    def running(self) -> list[Sequence]:
        """Sequences holding pages, in arrival order."""
        return self.queues.running

    # ---- requests --------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request (one sequence), or finish it at once.

        Rejected with ``context_length_exceeded``: a prompt that leaves no room for one token
        under ``max_model_len``, or (chunked prefill off) a prompt longer than
        ``max_num_batched_tokens``. Rejected with ``cache_capacity_exceeded``: its K/V alone,
        at its largest (prompt + max_tokens - 1 tokens, or the window bound), would need more
        pages than the pool holds.
        ``max_tokens == 0`` finishes with "length" at once (after the prompt when prompt
        logprobs are asked).
        The outcome is returned by the next :meth:`postprocess`.

        Raises:
            ValueError: the request id is already in use.
        """
        if seq.request_id in self.queues.requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in use")
        now = time.monotonic()
        reason = self._rejection(seq)
        at_once = seq.params.max_tokens == 0 and seq.params.prompt_logprobs is None
        if reason is not None or at_once:
            if reason is None:
                seq.finish("length", now)
            else:
                seq.finish(reason[0], now, error=reason[1])
            self.queues.finish_outside_step(seq)
            return
        self.queues.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str, reason: str = FINISH_ABORT, error: str | None = None) -> bool:
        """Finish a request with ``reason`` (and ``error``) wherever it is, freeing its pages
        exactly once; its output comes with the next :meth:`postprocess` or
        :meth:`take_pending`.

        Returns:
            True when the request was waiting or running; False when unknown or finished.
        """
        seq = self.queues.requests.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.cache.free_sequence(seq.seq_id)
        else:
            self.queues.remove_waiting(seq)  # waiting, or waiting for its KV
        seq.finish(reason, time.monotonic(), error=error)
        self.queues.finish_outside_step(seq)
        return True

    def get(self, request_id: str) -> Sequence | None:
        """The sequence of a waiting or running request, None when unknown/finished."""
        return self.queues.requests.get(request_id)

    def has_unfinished(self) -> bool:
        """True while a request is waiting (for its KV too) or running, or an output is still
        to be returned."""
        q = self.queues
        return bool(self.waiting or self.running or q.pending or q.num_waiting_for_kv)

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

    # ---- one step --------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Pick this step's tokens, reserve their KV slots and freeze them into the step's
        plan (see the module doc).

        Raises:
            Whatever the cache raises (a bug): every reservation of this call is given back
            first and every admitted sequence waits again where it was; preemptions stand
            (each is complete on its own).
        """
        journal = StepJournal()
        try:
            self.planner.plan(journal)
            ids = [s.seq.seq_id for s in journal.scheduled]
            tables = self.cache.group_page_tables(ids)
            plan = build_plan(journal.scheduled, tables, self.cache_config.page_size)
        except BaseException:
            journal.roll_back(self.cache, self.queues)
            raise
        journal.commit(time.monotonic(), self.stats)  # visible once the whole batch was reserved
        return plan

    def postprocess(self, plan: StepPlan, out: StepOutput) -> list[RequestOutput]:
        """Apply the step's output to its requests, the step's forward having succeeded
        (:meth:`StepPostprocessor.apply`: each request's tokens, its commit point, finishing
        and freeing).

        A request whose own row failed or whose token cannot be turned into text (a
        detokenizer or stop-string error) finishes with reason "error" and that message; the
        other requests are unaffected.

        Args:
            plan: what :meth:`schedule` returned.
            out: the runner's output for it.

        Returns:
            Outputs finished outside the step (rejections, aborts, failed steps) first, then
            one delta per request that changed this step, in batch order.

        Raises:
            ValueError: ``out`` lacks a planned request or sample (nothing is applied).
        """
        check_output(plan, out)
        outputs = self.take_pending()
        outputs += self.postprocessor.apply(plan, out, time.monotonic())
        if plan.requests:
            self.stats.record_step(len(plan.requests), plan.num_tokens)
        return outputs

    def fail_step(self, plan: StepPlan, error: str) -> None:
        """The step's forward raised: finish each of its requests with reason "error".

        Nothing is rolled back because nothing was committed: the pages they reserved this
        step never entered the prefix index and go back to the pool as empty pages. Their
        final outputs come from the next :meth:`postprocess` or :meth:`take_pending`.
        """
        now = time.monotonic()
        for request_id in plan.request_ids:
            seq = self.queues.requests.get(request_id)
            if seq is None:
                continue
            self.queues.fail(seq, error, now)
            self.queues.keep_output(seq)

    def take_pending(self) -> list[RequestOutput]:
        """Outputs of requests finished outside a step (rejections, aborts, failed steps)."""
        return self.queues.take_pending()
