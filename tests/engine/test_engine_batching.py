"""Continuous batching, chunked prefill and prefix caching give each request its solo output."""

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

MODEL = tiny_model()
RNG = np.random.default_rng(1)
PROMPTS = [RNG.integers(3, MODEL.config.vocab_size, n).tolist() for n in (3, 17, 8, 31, 12, 5)]


def test_batch_with_staggered_arrivals_equals_solo_runs() -> None:
    params = [
        GREEDY,
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=1.2, top_k=20, seed=5, max_tokens=12, ignore_eos=True),
        GREEDY,
        GREEDY,
    ]
    arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]] = {
        0: [("r0", PROMPTS[0], params[0]), ("r1", PROMPTS[1], params[1])],
        1: [("r2", PROMPTS[2], params[2])],
        3: [("r3", PROMPTS[3], params[3]), ("r4", PROMPTS[4], params[4])],
        7: [("r5", PROMPTS[5], params[5])],
    }
    engine = make_engine(MODEL, page_size=4, num_pages=128, max_num_batched_tokens=20)
    outs = drain(engine, arrivals)
    for i in range(6):
        got = tokens(outs[f"r{i}"])
        assert len(got) == params[i].max_tokens
        assert got == solo(MODEL, PROMPTS[i], params[i]), f"r{i}"
        assert outs[f"r{i}"][-1].outputs[0].finish_reason == "length"
    stats = engine.get_stats()
    assert stats["num_prompt_tokens"] == sum(len(p) for p in PROMPTS)
    assert stats["num_generation_tokens"] == sum(p.max_tokens for p in params)
    assert stats["num_finished"] == {"length": 6}
    assert_all_pages_free(engine)


@pytest.mark.parametrize("chunk", [1, 3, 5, 7, 9])
def test_chunked_prefill_equals_unchunked(chunk: int) -> None:
    prompt = PROMPTS[3]  # 31 tokens over pages of 4: chunks split pages mid-way
    whole = solo(MODEL, prompt, GREEDY, enable_chunked_prefill=False)
    engine = make_engine(
        MODEL,
        page_size=4,
        num_pages=64,
        max_num_batched_tokens=chunk,
        long_prefill_token_threshold=chunk,
    )
    outs = drain(engine, {0: [("a", prompt, GREEDY)], 2: [("b", PROMPTS[1], GREEDY)]})
    assert tokens(outs["a"]) == whole
    assert tokens(outs["b"]) == solo(MODEL, PROMPTS[1], GREEDY)
    # Mid-prompt chunks sample nothing: the first output comes once the prompt is computed.
    assert all(len(o.outputs[0].token_ids) == 1 for o in outs["a"])
    assert_all_pages_free(engine)


@pytest.mark.parametrize(
    ("prompt_len", "page_size", "expected_cached"),
    [(32, 16, 16), (33, 16, 32), (31, 16, 16), (16, 16, 0), (12, 4, 8), (13, 4, 12)],
)
def test_prefix_cache_reuse_reports_exact_cached_tokens(
    prompt_len: int, page_size: int, expected_cached: int
) -> None:
    prompt = np.random.default_rng(prompt_len).integers(3, 272, prompt_len).tolist()
    expected = solo(MODEL, prompt, GREEDY, enable_prefix_caching=False)
    engine = make_engine(MODEL, page_size=page_size, num_pages=32)
    first = drain(engine, {0: [("first", prompt, GREEDY)]})["first"]
    second = drain(engine, {0: [("second", prompt, GREEDY)]})["second"]
    assert tokens(first) == tokens(second) == expected
    assert first[-1].num_cached_tokens == 0
    # Full pages of the first prompt_len - 1 tokens: the last token is always computed.
    assert second[-1].num_cached_tokens == expected_cached
    stats = engine.get_stats()
    assert stats["prefix_cache_queries"] == 2 * prompt_len
    assert stats["prefix_cache_hits"] == expected_cached
    assert_all_pages_free(engine)


def test_identical_prompts_in_one_step_and_shared_prefixes() -> None:
    base = PROMPTS[3]
    prompts = {"a": base, "b": base, "c": [*base[:16], 7, 8, 9], "d": base[:20]}
    engine = make_engine(MODEL, page_size=4, num_pages=64)
    outs = drain(engine, {0: [(k, p, GREEDY) for k, p in prompts.items()]})
    for key, prompt in prompts.items():
        assert tokens(outs[key]) == solo(MODEL, prompt, GREEDY), key
    # "a" registers its pages while being scheduled; the others hit them in the same step
    # (the forward writes every layer's KV before attention reads it).
    assert [outs[k][-1].num_cached_tokens for k in "abcd"] == [0, 28, 16, 16]
    assert_all_pages_free(engine)
    # One step later "a"'s 7 full pages are written and committed: the others hit them.
    engine = make_engine(MODEL, page_size=4, num_pages=64)
    later = [(k, p, GREEDY) for k, p in prompts.items() if k != "a"]
    outs = drain(engine, {0: [("a", base, GREEDY)], 1: later})
    for key, prompt in prompts.items():
        assert tokens(outs[key]) == solo(MODEL, prompt, GREEDY), key
    assert [outs[k][-1].num_cached_tokens for k in "abcd"] == [0, 28, 16, 16]
    assert_all_pages_free(engine)


def test_prefix_caching_off_reports_no_hits() -> None:
    engine = make_engine(MODEL, page_size=4, num_pages=64, enable_prefix_caching=False)
    drain(engine, {0: [("a", PROMPTS[3], GREEDY)]})
    outs = drain(engine, {0: [("b", PROMPTS[3], GREEDY)]})
    assert outs["b"][-1].num_cached_tokens == 0
    assert engine.get_stats()["prefix_cache_hits"] == 0
