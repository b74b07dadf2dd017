"""ParentRequest: a request with ``n`` / ``best_of`` > 1 runs as child requests of one completion
each, and its parent folds their outputs into the request's outputs (vLLM V1's
``ParentRequest``, ``vllm/v1/engine/parallel_sampling.py``).

Child ``i`` has the request id ``f"{i}_{request_id}"``, ``n = 1`` and the seed ``seed + i``
(``seed`` being the request's, or one the engine drew). Only child 0 computes the prompt
logprobs; with ``best_of > n`` every child computes its sampled tokens' logprobs, which rank
the completions. The scheduler, the step plan, the runner and the postprocessor see only
single-completion requests; the children share the prompt's full pages through the prefix
cache (:attr:`pagedattn.engine.sequence.Sequence.prefix_lead`).
"""

from __future__ import annotations

import dataclasses

from pagedattn.engine.outputs import (
    FINISH_ERROR,
    CompletionOutput,
    RequestOutput,
    merge_delta,
)
from pagedattn.sampling_params import SamplingParams


def child_request_id(index: int, request_id: str) -> str:
    """The request id of child ``index`` of ``request_id`` (vLLM's rule)."""
    return f"{index}_{request_id}"


def child_params(params: SamplingParams, seed: int) -> list[SamplingParams]:
    """The sampling parameters of each child of a request with ``params`` and ``seed``: one
    completion each, child ``i`` seeded ``seed + i``, prompt logprobs asked of child 0 only,
    and with ``best_of > n`` the sampled tokens' logprobs computed (``logprobs=0`` when none
    were asked: the parent drops them from what it reports)."""
    ranks = params.num_completions > params.n
    logprobs = 0 if ranks and params.logprobs is None else params.logprobs
    return [
        dataclasses.replace(
            params,
            n=1,
            best_of=None,
            seed=seed + i,
            logprobs=logprobs,
            prompt_logprobs=params.prompt_logprobs if i == 0 else None,
        )
        for i in range(params.num_completions)
    ]


class ParentRequest:
    """One request's children and the outputs built from theirs.

    ``n`` completions: each step's child deltas are reported together, completion ``i`` being
    child ``i``'s. ``best_of > n``: nothing is reported until every child finished; then the
    ``n`` children with the highest cumulative logprob, whole, re-indexed ``0 .. n - 1`` in that
    order. Either way the prompt logprobs (child 0's) come once, ``num_cached_tokens`` is child
    0's (the prompt is counted once) and the request is finished when every child is. A child
    that fails makes the request fail: :meth:`add` names the other children to end with its
    error, and ``error`` is that child's.

    Args:
        request_id: the request's id.
        params: the request's sampling parameters (``num_completions`` > 1).
    """

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.params = params
        self.child_ids = [child_request_id(i, request_id) for i in range(params.num_completions)]
        self._index = {cid: i for i, cid in enumerate(self.child_ids)}
        self._whole: dict[str, RequestOutput] = {}  # best_of > n: each child's whole output
        self._finished: set[str] = set()
        self._deltas: dict[int, CompletionOutput] = {}
        self._prompt_logprobs: RequestOutput | None = None
        self._latest: RequestOutput | None = None  # child 0's, else any child's
        self.error: str | None = None

    @property
    def ranks(self) -> bool:
        """True when ``best_of > n`` (the best ``n`` of the children are reported)."""
        return self.params.num_completions > self.params.n

    @property
    def finished(self) -> bool:
        return len(self._finished) == len(self.child_ids)

    def add(self, out: RequestOutput) -> list[str]:
        """Fold one child's delta in; returns the ids of the unfinished children to end with
        this child's error (empty unless it is the first child to fail)."""
        cid = out.request_id
        if self._latest is None or cid == self.child_ids[0]:
            self._latest = out
        if out.prompt_logprobs is not None:
            self._prompt_logprobs = out
        to_fail: list[str] = []
        if out.finished:
            self._finished.add(cid)
            failed = any(c.finish_reason == FINISH_ERROR for c in out.outputs)
            if out.error is not None and self.error is None:
                self.error = out.error
                if failed:
                    to_fail = [c for c in self.child_ids if c not in self._finished]
        if self.ranks:
            merge_delta(self._whole, out)
        else:
            for c in out.outputs:
                self._deltas[self._index[cid]] = dataclasses.replace(c, index=self._index[cid])
        return to_fail

    def take_output(self) -> RequestOutput | None:
        """The request's delta since the previous call, or None when nothing is reported."""
        latest = self._latest
        if latest is None or (self.ranks and not self.finished):
            return None
        if self.ranks:
            outputs = self._best()
        else:
            outputs = [self._deltas[i] for i in sorted(self._deltas)]
            self._deltas = {}
        prompt_logprobs = None
        if self._prompt_logprobs is not None:
            prompt_logprobs = self._prompt_logprobs.prompt_logprobs
            self._prompt_logprobs = None
        if not outputs and prompt_logprobs is None and not self.finished:
            return None
        return RequestOutput(
            request_id=self.request_id,
            prompt=latest.prompt,
            prompt_token_ids=latest.prompt_token_ids,
            outputs=outputs,
            finished=self.finished,
            metrics=latest.metrics,
            num_cached_tokens=latest.num_cached_tokens,
            prompt_logprobs=prompt_logprobs,
            error=self.error,
        )

    def _best(self) -> list[CompletionOutput]:
        """The ``n`` whole completions with the highest cumulative logprob, re-indexed."""
        whole = [self._whole[c].outputs[0] for c in self.child_ids if self._whole[c].outputs]
        best = sorted(whole, key=lambda c: -(c.cumulative_logprob or 0.0))[: self.params.n]
        keep = self.params.logprobs is not None
        return [
            dataclasses.replace(c, index=i, logprobs=c.logprobs if keep else None)
            for i, c in enumerate(best)
        ]
