"""The step as a message boundary: the scheduler's frozen StepPlan (logits rows laid out once),
the runner's StepOutput keyed by request id, and the one function that applies it. Expected
rows and offsets are derived by hand from the requests' sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.engine.helpers import assert_all_pages_free, drain, make_engine, tiny_model

from pagedattn.engine.step_output import StepOutput
from pagedattn.sampling_params import SamplingParams


def test_the_plan_lays_out_prompt_and_sample_rows_and_they_stay_as_sampled() -> None:
    engine = make_engine(
        tiny_model(),
        page_size=4,
        num_pages=64,
        max_num_batched_tokens=64,
        long_prefill_token_threshold=16,
    )
    a = SamplingParams(max_tokens=2, prompt_logprobs=1, temperature=0.0, ignore_eos=True)
    b = SamplingParams(n=3, max_tokens=2, temperature=1.0, seed=5, ignore_eos=True)
    engine.add_request(list(range(3, 13)), a, request_id="a")  # 10 prompt tokens
    engine.add_request(list(range(20, 25)), b, request_id="b")  # 5 prompt tokens
    plan = engine.scheduler.schedule()
    ra, rb = plan.requests
    # a: prompt rows for positions 0..8 (each scores the next prompt token), sample row 9
    assert (ra.request_id, ra.rows.prompt, ra.rows.sample) == ("a", range(0, 9), 9)
    assert ra.prompt_first == 1 and ra.prompt_targets == tuple(range(4, 13))
    # b: child 0 alone (its siblings wait for its prompt pages); its last prompt token (fed
    # token 10 + 4) is row 10
    assert (rb.request_id, rb.rows.prompt, rb.rows.sample) == ("0_b", range(0), 10)
    assert rb.sampling is not None and rb.sampling.params.seed == 5 and ra.sampling is not None
    assert plan.logits_indices.tolist() == [*range(10), 14]
    assert plan.num_sampled == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        ra.start = 3  # type: ignore[misc]

    out = engine.runner.run(plan)
    assert set(out.requests) == {"a", "0_b"}
    assert out.requests["0_b"].sample is not None
    lp = out.requests["a"].prompt_logprobs
    assert lp is not None and lp[0] == 1 and len(lp[1]) == 9
    engine.scheduler.postprocess(plan, out)
    # applying the output leaves the plan describing what was sampled
    assert plan.num_sampled == out.num_sampled == 2
    assert rb.sampling.output_token_ids == ()
    seqs = [engine.scheduler.get(f"{i}_b") for i in range(3)]
    assert [s.num_generated_tokens for s in seqs if s is not None] == [1, 0, 0]
    assert engine.scheduler.get("a").num_computed_tokens == 10  # type: ignore[union-attr]
    drain(engine)
    assert_all_pages_free(engine)


def test_an_output_missing_a_planned_sample_is_refused_before_anything_is_applied() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, seed=1), request_id="r")
    plan = engine.scheduler.schedule()
    out = engine.runner.run(plan)
    out.requests["r"].sample = None
    with pytest.raises(ValueError, match="no sampled token"):
        engine.scheduler.postprocess(plan, out)
    with pytest.raises(ValueError, match="missing"):
        engine.scheduler.postprocess(plan, StepOutput())
    seq = engine.scheduler.get("r")
    assert seq is not None and seq.num_computed_tokens == 0 and seq.num_generated_tokens == 0


def test_a_mid_prompt_chunk_samples_nothing_and_keeps_its_progress_until_applied() -> None:
    engine = make_engine(
        tiny_model(), page_size=4, num_pages=64, max_num_batched_tokens=8,
        long_prefill_token_threshold=8,
    )  # fmt: skip
    engine.add_request(list(range(3, 23)), SamplingParams(max_tokens=1), request_id="r")
    plan = engine.scheduler.schedule()
    (r,) = plan.requests
    assert (r.start, r.num_new_tokens, r.rows.sample) == (0, 8, None)
    assert plan.logits_indices.size == 0 and plan.num_sampled == 0
    assert r.positions.tolist() == list(range(8)) and r.token_ids.tolist() == list(range(3, 11))
    assert r.kv[0].slot_mapping.shape == (8,) and len(r.kv) == 1
    seq = engine.scheduler.get("r")
    assert seq is not None and seq.num_computed_tokens == 0
    out = engine.runner.run(plan)
    assert out.requests["r"].sample is None
    engine.scheduler.postprocess(plan, out)
    assert seq.num_computed_tokens == 8
    assert np.array_equal(plan.requests[0].positions, np.arange(8))
