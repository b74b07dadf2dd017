"""Out of pages: preemption by recompute, rejection of requests that never fit, abort."""

from __future__ import annotations

import numpy as np
import pytest
from tests.engine.helpers import (
    GREEDY,
    assert_all_pages_free,
    drain,
    make_engine,
    solo,
    tiny_model,
    tokens,
)

from pagedattn.sampling_params import SamplingParams

MODEL = tiny_model(seed=3)
RNG = np.random.default_rng(7)
PROMPTS = [RNG.integers(3, MODEL.config.vocab_size, n).tolist() for n in (9, 14, 6, 11, 13)]
LONG = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=3, max_tokens=14, ignore_eos=True)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_small_pool_preempts_and_every_output_equals_its_solo_run(prefix_caching: bool) -> None:
    # Each request needs up to 7 pages of 4 tokens; 5 of them cannot all run in 12 pages.
    engine = make_engine(MODEL, page_size=4, num_pages=12, enable_prefix_caching=prefix_caching)
    params = [LONG, SEEDED, LONG, SEEDED, LONG]
    outs = drain(engine, {0: [(f"r{i}", p, params[i]) for i, p in enumerate(PROMPTS)]})
    stats = engine.get_stats()
    assert stats["num_preemptions"] > 0
    for i, prompt in enumerate(PROMPTS):
        assert tokens(outs[f"r{i}"]) == solo(MODEL, prompt, params[i]), f"r{i}"
    # Recomputation after preemption is not a prefix-cache query or hit.
    assert stats["prefix_cache_queries"] == sum(len(p) for p in PROMPTS)
    assert stats["prefix_cache_hits"] == 0
    assert_all_pages_free(engine)


def test_request_that_never_fits_is_rejected_at_once_and_others_complete() -> None:
    engine = make_engine(MODEL, page_size=4, num_pages=6)
    huge = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request(PROMPTS[0], GREEDY, request_id="ok1")
    engine.add_request(PROMPTS[1], huge, request_id="huge")  # 14 + 39 KV tokens: 14 pages
    engine.add_request(PROMPTS[2], GREEDY, request_id="ok2")
    first = {o.request_id: o for o in engine.step()}
    assert (
        first["huge"].finished
        and first["huge"].outputs[0].finish_reason == "cache_capacity_exceeded"
    )
    assert first["huge"].error is not None and "6" in first["huge"].error
    assert first["huge"].outputs[0].token_ids == [] and engine.scheduler.get("huge") is None
    outs = drain(engine)
    for rid, prompt in (("ok1", PROMPTS[0]), ("ok2", PROMPTS[2])):
        got = [*first[rid].outputs[0].token_ids, *tokens(outs[rid])]
        assert got == solo(MODEL, prompt, GREEDY)
    assert engine.get_stats()["num_finished"] == {"cache_capacity_exceeded": 1, "length": 2}
    assert_all_pages_free(engine)


def test_prompt_longer_than_the_context_is_rejected() -> None:
    model = tiny_model(max_position_embeddings=16)
    engine = make_engine(model, page_size=4, num_pages=64)
    engine.add_request(list(range(3, 19)), GREEDY, request_id="long")  # 16 tokens: no room
    engine.add_request(list(range(3, 15)), GREEDY, request_id="fits")  # 12 + 4 generated
    outs = drain(engine)
    assert outs["long"][-1].outputs[0].finish_reason == "context_length_exceeded"
    assert outs["fits"][-1].outputs[0].finish_reason == "length"
    assert len(tokens(outs["fits"])) == 4  # stops at max_model_len = 16


def test_chunked_prefill_off_rejects_a_prompt_over_the_budget() -> None:
    engine = make_engine(
        MODEL, page_size=4, num_pages=64, max_num_batched_tokens=8, enable_chunked_prefill=False
    )
    engine.add_request(PROMPTS[1], GREEDY, request_id="big")
    assert drain(engine)["big"][-1].outputs[0].finish_reason == "context_length_exceeded"


def test_max_tokens_zero_finishes_without_model_work() -> None:
    engine = make_engine(MODEL, page_size=4, num_pages=8)
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=0), request_id="z")
    (out,) = engine.step()
    assert (
        out.finished and out.outputs[0].finish_reason == "length" and out.outputs[0].token_ids == []
    )
    assert engine.get_stats()["num_steps"] == 0 and not engine.has_unfinished_requests()


def test_duplicate_request_id_raises() -> None:
    engine = make_engine(MODEL, page_size=4, num_pages=8)
    engine.add_request(PROMPTS[0], GREEDY, request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request(PROMPTS[0], GREEDY, request_id="x")


@pytest.mark.parametrize("stage", ["waiting", "mid_prefill", "decoding", "finished"])
def test_abort_at_each_stage_frees_pages_exactly_once(stage: str) -> None:
    engine = make_engine(
        MODEL, page_size=4, num_pages=16, max_num_batched_tokens=5, long_prefill_token_threshold=5
    )
    engine.add_request(PROMPTS[1], LONG, request_id="victim")  # 14 tokens: 3 chunks of 5
    engine.add_request(PROMPTS[2], GREEDY, request_id="other")
    steps = {"waiting": 0, "mid_prefill": 1, "decoding": 5, "finished": 40}[stage]
    seen = []
    for _ in range(steps):
        seen += [o for o in engine.step() if o.request_id == "victim"]
    seq = engine.scheduler.get("victim")
    if stage == "mid_prefill":
        assert seq is not None and 0 < seq.num_computed_tokens < seq.num_prompt_tokens
    if stage == "decoding":
        assert seq is not None and seq.num_generated_tokens > 0
    assert engine.abort("victim") == (stage != "finished")
    assert engine.abort("victim") is False  # a second abort is a no-op
    engine.cache_manager.check_integrity()  # refcounts equal page-table references
    rest = drain(engine)
    if stage != "finished":
        assert (
            rest["victim"][-1].outputs[0].finish_reason == "abort" and rest["victim"][-1].finished
        )
    else:
        assert seen[-1].outputs[0].finish_reason == "length"
    assert tokens(rest.get("other", [])) or stage == "finished"
    assert_all_pages_free(engine)
