"""The draft-length policy: the drafts that maximise a step's expected tokens per unit of time,
by the match behind them (values worked out by hand from the policy's formulas), and the
lookup's match length."""

from __future__ import annotations

import pytest

from pagedattn.engine.spec.ngram import NgramIndex, Proposal
from pagedattn.engine.spec.policy import (
    PASS_COST,
    PASS_ROWS,
    DraftState,
    bucket,
    prior,
    row_cost,
    step_cost,
)


def _state() -> DraftState:
    return DraftState(NgramIndex(2, 4))


def test_costs_and_buckets_by_hand() -> None:
    assert row_cost(0) == 0.15
    assert row_cost(1000) == pytest.approx((0.15 + 0.27) / 1.6)  # attention grows both
    assert row_cost(500, base=0.0) == 0.0
    assert step_cost(1, 0.15) == 1.0
    assert step_cost(PASS_ROWS, 0.15) == pytest.approx(1.0 + 0.15 * (PASS_ROWS - 1))
    # one row more starts a second weight pass (AVX-512: 0.8 of a step; unmodelled with AVX2)
    assert PASS_COST in (0.0, 0.8)
    assert step_cost(PASS_ROWS + 1, 0.15) == pytest.approx(1.0 + 0.15 * PASS_ROWS + PASS_COST)
    assert [bucket(m) for m in (1, 2, 3, 4, 7, 8, 15, 16, 32)] == [0, 1, 2, 3, 3, 4, 4, 5, 5]
    assert [prior(b) for b in (0, 3, 5)] == pytest.approx([1 / 3, 4 / 6, 16 / 18])


def test_long_matches_draft_up_to_one_weight_pass() -> None:
    s = _state()
    # a 16-token match: every draft 8/9 likely. Expected tokens per step time, by hand:
    # k = 1..7: 1.643, 2.061, 2.332, 2.503, 2.606, 2.659, 2.679 (0 keys: costs 1 + 0.15 k);
    # k = 8 needs a second pass with AVX-512 (5.881 / 3.0 = 1.96) and without any pass cost
    # gains less than its row costs (5.881 / 2.2 = 2.673, k = 9: 6.227 / 2.35 = 2.650).
    assert s.num_tokens(16, 16, 0, 1) == 7
    assert s.num_tokens(16, 2, 0, 1) == 2  # capped by the proposal
    # 16 rows already: a draft must bring 0.15 * 16 / (1 + 0.15 * 15) = 0.738 tokens (more with
    # a pass cost); a fresh 4-token match's are 2/3 likely: none drafted
    assert s.num_tokens(4, 16, 0, 16) == 0
    assert s.num_tokens(16, 16, 0, 1, base_cost=0.0) == 16  # rows treated as free
    assert s.num_tokens(0, 8, 0, 1) == 0  # no match


def test_short_matches_stop_drafting_once_they_fail() -> None:
    s = _state()
    # a one-token match: prior 1/3 > the row cost 0.15, one draft pays (1.333 / 1.15 > 1)
    assert s.acceptance(1) == pytest.approx(1 / 3)
    assert s.num_tokens(1, 8, 0, 1) == 1
    s.match_len = 1
    for _ in range(4):  # rejected four times: p = (2/3) / (2 + 1 + .8 + .64 + .512)
        s.record(1, 0)
    assert s.acceptance(1) == pytest.approx((2 / 3) / 4.952)
    assert s.num_tokens(1, 8, 0, 1) == 0
    assert s.acceptance(16) == pytest.approx(8 / 9)  # other buckets untouched


def test_record_counts_the_judged_drafts_only() -> None:
    s = _state()
    s.match_len = 4
    s.record(3, 1)  # draft 1 (match 4) kept, draft 2 (match 5) rejected, draft 3 not judged
    # bucket 4..7: verified 0.8 * 1 + 1 = 1.8, accepted 0.8 * 1 + 0 = 0.8
    assert s.acceptance(4) == pytest.approx((0.8 + 2 * 4 / 6) / (1.8 + 2))
    assert s.verified == pytest.approx([0, 0, 0, 1.8, 0, 0])


def test_lookup_measures_the_match_behind_the_drafts() -> None:
    index = NgramIndex(2, 4)
    # (5, 1, 2, 3) ended at 4; the tokens before agree once more (8), then the start: 5
    got = index.lookup([8, 5, 1, 2, 3, 7, 8, 5, 1, 2, 3], 2)
    assert (got.token_ids, got.match_len) == ([7, 8], 5)
    index = NgramIndex(2, 4)
    got = index.lookup([1, 2, 3, 4, 9, 2, 3, 4], 3)  # (2, 3, 4) at 3; 1 != 9: match 3
    assert (got.token_ids, got.match_len) == ([9, 2, 3], 3)
    assert NgramIndex(2, 4).lookup([1, 2, 3], 4) == Proposal()


def test_speculation_is_on_by_default_where_it_is_lossless() -> None:
    from pagedattn.engine.llm import engine_config

    assert engine_config().scheduler.speculative == "ngram"
    assert engine_config(speculative="none").scheduler.speculative is None
    assert engine_config(speculative=None).scheduler.speculative is None
    assert engine_config(sliding_window=64).scheduler.speculative is None  # auto: off here
    assert engine_config(backend="torch").scheduler.speculative is None
    with pytest.raises(ValueError, match="sliding_window"):
        engine_config(speculative="ngram", sliding_window=64)
    with pytest.raises(ValueError, match=r"SchedulerConfig\.speculative_row_cost"):
        engine_config(speculative_row_cost=1.5)
