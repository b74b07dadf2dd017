"""``LLM(kv_cache_dtype="int8")``: quantized KV pages through the offline API, as a user runs
them: the pool holds codes and scales, a batch answers as its requests alone do, and on the
embedded SmolLM2 greedy answers follow the float32 cache's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.fixtures import tiny_gguf

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

__all__ = ["tiny_gguf"]  # the fixture

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def test_int8_pool_answers_a_batch_as_each_request_alone(tiny_gguf: Path) -> None:
    llm = LLM(str(tiny_gguf), page_size=4, num_pages=128, kv_cache_dtype="int8")
    pool = llm.engine.page_pool
    assert pool.kv.dtype == np.int8 and pool.kv.shape[-1] == pool.head_dim + 4
    prompts = ["the cat sat on the mat", "a long way from home, the", "one two three four five"]
    batch = llm.generate(prompts, GREEDY, use_tqdm=False)
    fresh = LLM(str(tiny_gguf), page_size=4, num_pages=128, kv_cache_dtype="int8")
    alone = [fresh.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in batch] == [o.outputs[0].token_ids for o in alone]
    assert all(len(o.outputs[0].token_ids) == 12 for o in batch)
    scales = pool.kv.view(np.float32)[..., -1]  # every written row carries its scale
    assert (scales > 0).sum() > 0 and np.isfinite(scales).all()


@pytest.mark.model
def test_int8_greedy_answers_follow_the_float32_cache_on_smollm2() -> None:
    """Measured: the same 24 greedy tokens on these prompts, prompt logprobs within 0.061
    of the float32 cache's (float32 itself is within 1e-3 of HF transformers)."""
    prompts = ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):"]
    params = SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=0, logprobs=0
    )
    runs = {}
    for dtype in ("float32", "int8"):
        llm = LLM(page_size=16, num_pages=64, kv_cache_dtype=dtype)
        runs[dtype] = llm.generate(prompts, params, use_tqdm=False)
    worst = 0.0
    for exact, quantized in zip(runs["float32"], runs["int8"], strict=True):
        assert quantized.outputs[0].token_ids == exact.outputs[0].token_ids
        for a, b in zip(exact.prompt_logprobs or [], quantized.prompt_logprobs or [], strict=True):
            if a is None or b is None:
                continue
            (token, lp_a), lp_b = next(iter(a.items())), b[next(iter(a))]
            worst = max(worst, abs(lp_a.logprob - lp_b.logprob))
            assert token in b
    assert worst < 0.1
