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

:func:`commit_run` appends the kept tokens one by one (a stop token, stop string, ``max_tokens``
or ``max_model_len`` ends the request exactly where plain decoding would), then commits the KV
of the tokens appended (positions up to the last appended token's predecessor: what plain
decoding would have computed by then) and gives the other draft slots back to the cache.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from pagedattn.cache import CacheManager
from pagedattn.engine.logprobs import TokenLogprobs, log_softmax, token_logprobs
from pagedattn.engine.outputs import FINISH_ERROR
from pagedattn.engine.sampler import sample_each
from pagedattn.engine.scheduled_batch import ScheduledSeq
from pagedattn.engine.stats import SchedulerStats


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
    first_row: int,
    first_token: int,
    item: ScheduledSeq,
    eos_token_ids: Collection[int],
) -> AcceptedRun:
    """Sample the draft rows of ``item`` after its step token ``first_token``.

    Args:
        logits: the step's (rows, vocab) logits, padded ids masked.
        first_row: the row of the step token; draft ``j`` (from 0) is row ``first_row + 1 + j``.
        first_token: the token sampled from ``first_row``.
        item: the drafted sequence's share of the step.
        eos_token_ids: the engine's end-of-sequence ids (min_tokens masks them).

    Returns:
        The run; empty when ``first_token`` differs from the first draft.
    """
    seq, drafts = item.seq, item.draft_token_ids
    params = seq.params
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    eos = tuple(sorted(eos_token_ids))
    run = AcceptedRun()
    last = first_token
    for j, draft in enumerate(drafts):
        if last != draft or last in stops:  # a stop token ends the request there
            break
        row = first_row + 1 + j
        output = [*seq.output_token_ids, first_token, *run.token_ids]
        ids, errors = sample_each(
            logits[row : row + 1], [params], [seq.generator], [output],
            [seq.prompt_token_ids], eos,
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


def commit_run(
    item: ScheduledSeq,
    run: AcceptedRun | None,
    eos_token_ids: Collection[int],
    now: float,
    cache: CacheManager,
    stats: SchedulerStats,
) -> tuple[int, int]:
    """Append a drafted sequence's accepted run, commit the KV it confirms, give back the rest.

    Called after the step token was appended (and the step's first KV token committed).

    Args:
        item: the drafted sequence's share of the step.
        run: from :func:`sample_run`; None when the step token itself failed.
        eos_token_ids: the engine's end-of-sequence ids.
        now: ``time.monotonic()`` of the step.
        cache: the page tables.
        stats: counts drafted, accepted and generated tokens.

    Returns:
        ``(num_drafted, num_accepted)``: the drafts, and those whose KV was kept.

    Raises:
        Whatever appending a token raises (its request then fails; the sequence is freed).
    """
    seq = item.seq
    appended = 0
    if run is not None and not seq.is_finished:
        for token_id, lp in zip(run.token_ids, run.logprobs, strict=True):
            seq.append_token(token_id, eos_token_ids, now, lp)
            stats.num_generation_tokens += 1
            appended += 1
            if seq.is_finished:
                break
        else:
            if run.error is not None:
                seq.finish(FINISH_ERROR, now, error=run.error)
    start = seq.num_computed_tokens
    seq.num_computed_tokens += appended  # draft i's KV is kept once its successor is appended
    cache.commit_written(seq.seq_id, seq.num_computed_tokens)
    cache.pages_computed(seq.seq_id, start, seq.num_computed_tokens)
    cache.unreserve(seq.seq_id, seq.num_computed_tokens)
    num_drafted = len(item.draft_token_ids)
    stats.spec_num_drafted_tokens += num_drafted
    stats.spec_num_accepted_tokens += appended
    stats.spec_num_verifies += 1
    return num_drafted, appended
