"""StepPostprocessor: each request's share of a step that ran, applied on its own.

For every scheduled sequence, in batch order: its prompt logprobs, its fork into the request's
other completions (:mod:`pagedattn.engine.forks`, on its first sampled token), the sampled
tokens with their stop checks, and the retirement of what finished. A request whose part of
this raises finishes alone with reason "error"; the other requests are unaffected.
"""

from __future__ import annotations

from pagedattn.cache import CacheManager
from pagedattn.engine.forks import CopyPages, fork_children
from pagedattn.engine.logprobs import TokenLogprobs
from pagedattn.engine.outputs import FINISH_ERROR, FINISH_LENGTH, RequestOutput, is_dead_end
from pagedattn.engine.request_queues import RequestQueues
from pagedattn.engine.sampler_output import SamplerOutput
from pagedattn.engine.scheduled_batch import ScheduledBatch, ScheduledSeq
from pagedattn.engine.sequence_group import SequenceGroup
from pagedattn.engine.spec.acceptance import commit_run
from pagedattn.engine.spec.drafter import Drafter
from pagedattn.engine.stats import SchedulerStats


class StepPostprocessor:
    """Applies a step's sampled tokens to its requests.

    Args:
        cache: the page tables (forks share and copy pages here).
        queues: the waiting and running sequences and the live requests (changed in place).
        stats: counts sampled tokens.
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        drafter: speculative decoding's planner (a drafted sequence's verified run is applied
            here and adapts its draft length); None = speculation off.
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

    def apply(
        self,
        batch: ScheduledBatch,
        out: SamplerOutput,
        now: float,
        copy_pages: CopyPages | None,
    ) -> list[RequestOutput]:
        """Apply ``out`` (one token per ``batch.sample_rows`` entry, already checked) to the
        batch's requests, whose KV the step committed.

        Returns:
            One delta per request that changed this step, in batch order.
        """
        logprobs = out.logprobs or [None] * len(out.token_ids)
        row = 0
        touched: dict[str, SequenceGroup] = {}
        for item in batch.seqs:
            seq, first_row = item.seq, row
            row += (1 + len(seq.fork_children)) if item.samples else 0
            group = self.queues.requests.get(seq.request_id)
            if group is None or seq.is_finished:  # its request failed earlier in this loop
                continue
            touched[seq.request_id] = group
            try:
                self._apply_seq(item, group, out, logprobs, first_row, now, copy_pages)
            except Exception as exc:  # this request's bookkeeping, not the step's
                self.queues.fail_group(group, f"{type(exc).__name__}: {exc}", now)
        outputs: list[RequestOutput] = []
        for group in touched.values():
            delta = group.take_output()
            if delta is not None:
                outputs.append(delta)
        return outputs

    def _apply_seq(
        self,
        item: ScheduledSeq,
        group: SequenceGroup,
        out: SamplerOutput,
        logprobs: list[TokenLogprobs | None],
        row: int,
        now: float,
        copy_pages: CopyPages | None,
    ) -> None:
        """One scheduled sequence's share: prompt logprobs, its fork, the sampled tokens (from
        ``row`` on), finishing and freeing."""
        seq = item.seq
        if seq.seq_id in out.prompt_logprobs:
            seq.add_prompt_logprobs(*out.prompt_logprobs[seq.seq_id])
        if not item.samples:
            if seq.num_computed_tokens == seq.num_tokens and seq.params.max_tokens == 0:
                seq.finish("length", now)  # prompt logprobs only
                group.finish_unforked("length", now)
                self.queues.retire(seq, group)
            return
        children, seq.fork_children = seq.fork_children, []
        if children:
            if copy_pages is None:
                raise ValueError("n / best_of > 1: this scheduler has no copy_pages")
            new = fork_children(seq, children, self.cache, copy_pages)
            for child in new.running:
                self.queues.insert_running(child)
            self.queues.waiting.extendleft(reversed(new.waiting))
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
            if error is not None and is_dead_end(error):
                s.finish(FINISH_LENGTH, now)  # its constraints allow no next token
            elif error is not None:
                s.finish(FINISH_ERROR, now, error=error)
            if item.draft_token_ids:  # the drafts it confirmed; the others' slots go back
                run = None if error is not None else out.accepted.get(row - 1)
                drafted, accepted = commit_run(item, run, self.eos_token_ids, now, self.cache,
                                               self.stats)  # fmt: skip
                if self.drafter is not None:
                    self.drafter.record(s, drafted, accepted)
            if s.is_finished:
                self.queues.retire(s, group)
