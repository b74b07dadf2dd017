"""step() reports what it did: tokens, pages, prefix hits, preemptions and phase timings.
Expected figures are derived by hand from the prompts and the page size."""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine.helpers import make_engine, tiny_model

from pagedattn.engine.step_report import StepReport
from pagedattn.sampling_params import SamplingParams

GREEDY3 = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _run(engine: Any) -> tuple[list[StepReport], int]:
    reports, generated = [], 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        reports.append(outputs.report)
        generated += sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return reports, generated


def test_reports_count_tokens_pages_and_prefix_hits() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=32)
    prompt = list(range(3, 15))  # 12 tokens: 3 full pages
    engine.add_request(prompt, GREEDY3, request_id="a")
    first, *rest = _run(engine)[0]
    assert (first.num_seqs, first.num_scheduled_tokens, first.num_generated_tokens) == (1, 12, 1)
    assert first.num_pages_used == 3 and first.num_pages == 32
    assert first.num_prefix_hit_tokens == 0 and first.ran_model and not first.failed
    # two decode steps, the second writes token 14 into a fourth page
    assert [(r.num_scheduled_tokens, r.num_generated_tokens) for r in rest] == [(1, 1), (1, 1)]
    assert [r.num_pages_used for r in rest] == [4, 4]
    t = first.timings
    assert t.run.forward_s > 0 and t.schedule_s >= 0 and t.postprocess_s >= 0
    assert t.total_s >= t.schedule_s + t.run.forward_s + t.postprocess_s
    # the same first 8 tokens: 2 full cached pages are hits, the rest is computed
    engine.add_request([*prompt[:8], 90, 91, 92], GREEDY3, request_id="b")
    again = _run(engine)[0][0]
    assert again.num_prefix_hit_tokens == 8 and again.num_scheduled_tokens == 3


def test_reports_add_up_to_the_engine_counters_under_preemption() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=8, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    for i in range(3):
        engine.add_request([5 + i] * 9, params, request_id=f"r{i}")
    reports, generated = _run(engine)
    stats = engine.get_stats()
    assert stats["num_preemptions"] > 0  # 3 x 23 tokens need 18 pages of the 8
    assert sum(r.num_preemptions for r in reports) == stats["num_preemptions"]
    assert sum(r.num_generated_tokens for r in reports) == generated == 3 * 14
    assert sum(r.num_scheduled_tokens for r in reports) == stats["num_computed_tokens"]
    assert max(r.num_pages_used for r in reports) <= 8


def test_a_failed_forward_is_reported_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=32)
    engine.add_request([4, 5, 6], GREEDY3, request_id="r")

    def broken(plan: Any) -> Any:
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "run", broken)
    outputs = engine.step()
    assert outputs.report.failed and outputs.report.num_seqs == 1
    assert outputs[0].error is not None and "device lost" in outputs[0].error
