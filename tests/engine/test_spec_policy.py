"""The draft-length policy: drafts only where their expected gain pays for their verify rows
(values worked out by hand from the policy's formula), and an engine that turns speculation
off for a batch and for a sequence whose drafts keep failing."""

from __future__ import annotations

import math

import pytest

from pagedattn.engine.spec.ngram import NgramIndex
from pagedattn.engine.spec.policy import DraftState, pays_threshold, row_cost


def _state() -> DraftState:
    return DraftState(NgramIndex(2, 4))


def test_row_cost_and_threshold_by_hand() -> None:
    assert row_cost(0) == 0.25
    assert row_cost(4000) == pytest.approx((0.25 + 1.0) / 2.0)  # attention 1.0 of a step
    assert row_cost(500, base=0.0) == 0.0
    assert pays_threshold(0.25, 1) == 0.25  # a single stream: the row's own cost
    assert pays_threshold(0.25, 16) == pytest.approx(4.0 / 4.75)


def test_single_stream_grows_with_acceptance_and_batches_do_not_draft() -> None:
    s = _state()
    assert s.acceptance == 0.5
    assert s.num_tokens(8, 0, 1) == 2  # 0.5 ** 2 >= 0.25 > 0.5 ** 3
    s.record(2, 2)  # both accepted: p = 2.5 / 3
    assert s.acceptance == pytest.approx(2.5 / 3)
    assert s.num_tokens(8, 0, 1) == int(math.log(0.25) / math.log(2.5 / 3)) == 7
    assert s.num_tokens(4, 0, 1) == 4  # capped
    assert s.num_tokens(8, 0, 16) == 0  # 16 rows: a draft needs p >= 0.84
    assert s.num_tokens(8, 0, 1, base_cost=0.0) == 8  # rows treated as free


def test_rejections_turn_drafting_off_then_probe() -> None:
    s = _state()
    s.record(1, 0)  # rejected: p = 0.5 / 2, one draft still pays
    assert s.acceptance == 0.25 and s.num_tokens(8, 0, 1) == 1
    s.record(1, 0)  # again: p = 0.5 / (0.7 + 1 + 1)
    assert s.acceptance == pytest.approx(0.5 / 2.7) and s.num_tokens(8, 0, 1) == 0
    s.hold()
    assert (s.pause, s.probe_due) == (2, True)
    s.hold()
    assert s.pause == 4
    for _ in range(5):
        s.hold()
    assert s.pause == 16  # at most
    s.record(1, 1)  # a probe accepted: pauses start again from 2
    assert s.pauses == 0


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
