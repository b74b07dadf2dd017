"""SequenceGroup: one request's completions (``n`` / ``best_of`` sequences forked from one
prefill) and the RequestOutput deltas built from them."""

from __future__ import annotations

import dataclasses

from pagedattn.engine.outputs import CompletionOutput, RequestOutput
from pagedattn.engine.sequence import Sequence


class SequenceGroup:
    """The sequences of one request.

    ``seqs[0]`` (the parent) computes the prompt; when it samples its first token it forks into
    ``seqs[1:]`` (``parent.fork_children``), which share its full prompt pages by reference count
    and copy its partially filled last page (``CacheManager.fork``). Until then the children are
    in no scheduler queue.

    Args:
        seqs: the request's sequences, index order (``seqs[i].index == i``), same request id,
            prompt and params; ``len(seqs) == params.num_completions``.

    Raises:
        ValueError: sequences that do not form one request.
    """

    def __init__(self, seqs: list[Sequence]) -> None:
        if not seqs or [s.index for s in seqs] != list(range(len(seqs))):
            raise ValueError("seqs: expected a non-empty list with indices 0 .. len - 1")
        parent = seqs[0]
        if len(seqs) != parent.params.num_completions:
            raise ValueError(
                f"seqs: expected {parent.params.num_completions} sequences (n / best_of), "
                f"got {len(seqs)}"
            )
        self.seqs = seqs
        self.parent = parent
        self.request_id = parent.request_id
        parent.fork_children = list(seqs[1:])
        self._prompt_logprobs_sent = False

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def finish_unforked(self, reason: str, now: float, error: str | None = None) -> None:
        """Finish the children not forked yet (the parent ended before sampling)."""
        for child in self.parent.fork_children:
            child.finish(reason, now, error)
        self.parent.fork_children = []

    def take_output(self) -> RequestOutput | None:
        """The request's delta since the previous call, or None when nothing is reported.

        Only the completions that changed are listed. With ``best_of > n`` nothing is reported
        until every sequence finished; then the ``n`` with the highest cumulative logprob are
        returned whole, re-indexed ``0 .. n - 1`` in that order.
        """
        parent, params = self.parent, self.parent.params
        finished = self.is_finished
        outputs: list[CompletionOutput]
        if params.num_completions > params.n:
            if not finished:
                return None
            best = sorted(self.seqs, key=lambda s: -(s.cumulative_logprob or 0.0))[: params.n]
            outputs = [dataclasses.replace(s.take_delta(), index=i) for i, s in enumerate(best)]
        else:
            outputs = [s.take_delta() for s in self.seqs if s.has_delta]
        prompt_logprobs = None
        if parent.prompt_logprobs is not None and not self._prompt_logprobs_sent:
            prompt_logprobs = parent.prompt_logprobs
            self._prompt_logprobs_sent = True
        if not outputs and prompt_logprobs is None:
            return None
        return RequestOutput(
            request_id=self.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            metrics=parent.metrics,
            num_cached_tokens=parent.num_cached_tokens,
            prompt_logprobs=prompt_logprobs,
            error=parent.error,
        )
