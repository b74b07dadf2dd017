"""StepPostprocessor: applies a step's output to its requests, after the step succeeded.

This is the one writer of a request's progress after a forward: for each planned request, in
batch order, its prompt logprobs, its sampled tokens with their stop checks (and, for a
verified sequence, the drafts its samples confirmed), then its commit point (its computed
tokens advance and the pages the forward filled enter the prefix index and the persistent
tier, :meth:`CacheManager.commit_written`; rejected drafts' slots go back), and its
retirement when it finished. A request whose part of this raises finishes alone with reason
"error" (what its forward wrote is still committed); the other requests are unaffected.

What it applies is fixed by the frozen plan and the runner's output: nothing it changes while
applying can move another request's rows.
"""

from __future__ import annotations

from pagedattn.cache import CacheManager
from pagedattn.engine.outputs import FINISH_ERROR, FINISH_LENGTH, RequestOutput, is_dead_end
from pagedattn.engine.request_queues import RequestQueues
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.spec.acceptance import append_run
from pagedattn.engine.spec.drafter import Drafter
from pagedattn.engine.stats import SchedulerStats
from pagedattn.engine.step_output import RequestStepOutput, SampledToken, StepOutput
from pagedattn.engine.step_plan import RequestPlan, StepPlan


def check_output(plan: StepPlan, out: StepOutput) -> None:
    """Raise ValueError unless ``out`` holds a sample for every request ``plan`` samples."""
    for r in plan.requests:
        got = out.requests.get(r.request_id)
        if got is None:
            raise ValueError(f"step output: request {r.request_id!r} is missing")
        if r.rows.sample is not None and got.sample is None:
            raise ValueError(f"step output: request {r.request_id!r} has no sampled token")


class StepPostprocessor:
    """Applies a step's output to its requests.

    Args:
        cache: the page tables (commits and draft slots).
        queues: the waiting and running sequences and the live requests (changed in place).
        stats: counts sampled, drafted and accepted tokens.
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        drafter: speculative decoding's planner (a verified sequence's acceptance adapts its
            draft length); None = speculation off.
    """

    def __init__(
        self,
        cache: CacheManager,
        queues: RequestQueues,
        stats: SchedulerStats,
        eos_token_ids: frozenset[int],
        drafter: Drafter | None = None,
    ) -> None:
        self.cache = cache
        self.queues = queues
        self.stats = stats
        self.eos_token_ids = eos_token_ids
        self.drafter = drafter

    def apply(self, plan: StepPlan, out: StepOutput, now: float) -> list[RequestOutput]:
        """Apply ``out`` (checked by :func:`check_output`) to the plan's requests.

        Returns:
            One delta per request that changed this step, in batch order.
        """
        touched: list[Sequence] = []
        for r in plan.requests:
            seq = self.queues.requests.get(r.request_id)
            if seq is None or seq.is_finished:  # failed earlier in this loop
                continue
            touched.append(seq)
            try:
                self._apply_request(r, seq, out.requests[r.request_id], now)
            except Exception as exc:  # this request's bookkeeping, not the step's
                self.queues.fail(seq, f"{type(exc).__name__}: {exc}", now)
        outputs: list[RequestOutput] = []
        for seq in touched:
            delta = seq.take_output()
            if delta is not None:
                outputs.append(delta)
        return outputs

    def _apply_request(
        self, r: RequestPlan, seq: Sequence, result: RequestStepOutput, now: float
    ) -> None:
        """One planned request's share: prompt logprobs, tokens, commit, retirement."""
        if seq.num_computed_tokens != r.start:
            raise RuntimeError(
                f"request {r.request_id!r}: planned from position {r.start}, "
                f"has {seq.num_computed_tokens} computed tokens"
            )
        kept = r.num_new_tokens
        try:
            if result.prompt_logprobs is not None:
                seq.add_prompt_logprobs(*result.prompt_logprobs)
            if r.rows.sample is not None and result.sample is not None:  # check_output: both
                kept += self._append_sample(seq, result.sample, now)
        finally:
            self._commit(r, seq, kept)
        prompt_only = seq.params.max_tokens == 0 and r.rows.sample is None
        if prompt_only and seq.num_computed_tokens == seq.num_tokens:
            seq.finish("length", now)  # prompt logprobs only
        if seq.is_finished:
            self.queues.retire(seq)

    def _append_sample(self, s: Sequence, sample: SampledToken, now: float) -> int:
        """Append a completion's sampled token, then the drafts it confirmed (a failed row or
        text fails it); returns the confirmed drafts appended."""
        error = self._append(s, sample, now)
        if error is not None and is_dead_end(error):
            s.finish(FINISH_LENGTH, now)  # its constraints allow no next token
        elif error is not None:
            s.finish(FINISH_ERROR, now, error=error)
        elif sample.accepted is not None:
            return append_run(s, sample.accepted, self.eos_token_ids, now, self.stats)
        return 0

    def _append(self, s: Sequence, sample: SampledToken, now: float) -> str | None:
        """Append one sampled token; returns why it failed (its row or its text), else None."""
        if sample.error is not None:
            return sample.error
        try:
            s.append_token(sample.token_id, self.eos_token_ids, now, sample.logprobs)
        except Exception as exc:  # this request's text, not the step's
            return f"token {sample.token_id}: {type(exc).__name__}: {exc}"
        self.stats.num_generation_tokens += 1
        return None

    def _commit(self, r: RequestPlan, seq: Sequence, kept: int) -> None:
        """The request's commit point: its forward succeeded, so its KV is written up to
        ``r.start + kept`` (its new tokens and the drafts its samples confirmed); the pages
        that filled enter the prefix index (:meth:`CacheManager.commit_written`) and go to the
        persistent tier (a no-op without one); a rejected draft's slot goes back."""
        seq.num_computed_tokens = r.start + kept
        self.cache.commit_written(seq.seq_id, seq.num_computed_tokens)
        self.cache.pages_computed(seq.seq_id, r.start, seq.num_computed_tokens)
        if not r.draft_token_ids:
            return
        self.cache.unreserve(seq.seq_id, seq.num_computed_tokens)
        drafted, accepted = len(r.draft_token_ids), kept - r.num_new_tokens
        self.stats.spec_num_drafted_tokens += drafted
        self.stats.spec_num_accepted_tokens += accepted
        self.stats.spec_num_verifies += 1
        if self.drafter is not None:
            self.drafter.record(seq, drafted, accepted)
