"""Acceptance: sample the verify rows in position order, keep the drafts the samples confirm.

Plain decoding samples position ``L + 1`` from the step row, appends it, and only then computes
position ``L + 2`` from it. Here the rows of ``L + 1 .. L + k + 1`` are already computed (each
bitwise as plain decoding would, see :mod:`pagedattn.engine.spec.verify`), under the assumption
that the tokens sampled are the drafts. :func:`sample_run` samples them one at a time, each with
the request's own sampler and generator and the output so far (penalties and ``min_tokens`` see
what plain decoding would), and stops at the first sample that differs from its draft: that
token is kept (plain decoding would have sampled it, from the same logits), the rows after it
are never sampled. A seeded request's generator thus draws exactly once per kept token, in
position order, as in plain decoding (greedy rows draw nothing), so seeded sampling stays
bitwise lossless too.

:func:`append_run` appends the kept tokens one by one (a stop token, stop string, ``max_tokens``
or ``max_model_len`` ends the request exactly where plain decoding would). The KV of every
confirmed draft is kept and the other draft slots go back to the cache when the step's output
is applied (:mod:`pagedattn.engine.step_postprocess`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.engine.logprobs import TokenLogprobs, log_softmax, token_logprobs
from pagedattn.engine.outputs import FINISH_ERROR
from pagedattn.engine.sampler import sample_each
from pagedattn.engine.stats import SchedulerStats

if TYPE_CHECKING:
    from pagedattn.engine.sequence import Sequence
    from pagedattn.engine.step_plan import RequestPlan, SamplingState


@dataclass(frozen=True)
class AcceptedRun:
    """The tokens a drafted sequence gains after its step token (which is sampled as usual).

    Attributes:
        token_ids: the confirmed drafts' successors, in position order: token ``i`` was
            sampled from the row of draft ``i`` (so draft ``i`` equalled the token before it).
        logprobs: per token its TokenLogprobs when the request needs them, else None.
        error: why the row after the last token could not be sampled (the request fails
            there, as in plain decoding), or None.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    error: str | None = None


def sample_run(
    logits: np.ndarray,
    plan: RequestPlan,
    state: SamplingState,
    first_token: int,
    eos_token_ids: Collection[int],
) -> AcceptedRun:
    """Sample the draft rows of ``plan`` after its step token ``first_token``.

    Args:
        logits: the step's (rows, vocab) logits, padded ids masked.
        plan: the drafted request's share of the step (draft ``j`` is row
            ``plan.rows.drafts[j]``).
        state: its sampling state before the step token.
        first_token: the token sampled from its sample row.
        eos_token_ids: the engine's end-of-sequence ids (min_tokens masks them).

    Returns:
        The run; empty when ``first_token`` differs from the first draft.
    """
    params = state.params
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    eos = tuple(sorted(eos_token_ids))
    run = AcceptedRun()
    last = first_token
    for draft, row in zip(plan.draft_token_ids, plan.rows.drafts, strict=True):
        if last != draft or last in stops:  # a stop token ends the request there
            break
        output = [*state.output_token_ids, first_token, *run.token_ids]
        ids, errors = sample_each(
            logits[row : row + 1], [params], [state.generator], [output],
            [state.prompt_token_ids], eos,
        )  # fmt: skip
        if errors:
            return AcceptedRun(run.token_ids, run.logprobs, errors[0])
        last = int(ids[0])
        run.token_ids.append(last)
        lp = None
        if params.needs_logprob:
            lp = token_logprobs(log_softmax(logits[row]), last, params.logprobs or 0)
        run.logprobs.append(lp)
    return run


def append_run(
    seq: Sequence,
    run: AcceptedRun,
    eos_token_ids: Collection[int],
    now: float,
    stats: SchedulerStats,
) -> int:
    """Append a drafted sequence's accepted run after its step token, one token at a time
    (a stop token, stop string, ``max_tokens`` or ``max_model_len`` ends it exactly where plain
    decoding would); a row that failed after the run fails the request there.

    Returns:
        The tokens appended.

    Raises:
        Whatever appending a token raises (its request then fails).
    """
    appended = 0
    for token_id, lp in zip(run.token_ids, run.logprobs, strict=True):
        if seq.is_finished:
            return appended
        seq.append_token(token_id, eos_token_ids, now, lp)
        stats.num_generation_tokens += 1
        appended += 1
    if run.error is not None and not seq.is_finished:
        seq.finish(FINISH_ERROR, now, error=run.error)
    return appended
