"""The hybrid KV cache on the real Gemma 3 270M (window 512 on 15 of its 18 layers): the same
bits as every layer keeping every page past the window, and a conversation whose later turns
reuse the earlier ones (marked ``model``; skips when the file is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.cache.hybrid_manager import HybridCacheManager
from pagedattn.engine.llm import LLM
from pagedattn.model.catalogue import models_dir
from pagedattn.sampling_params import SamplingParams

pytestmark = pytest.mark.model
PS = 16


def _gemma() -> Path:
    path = models_dir() / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is absent (pagedattn pull gemma-3-270m installs it)")
    return path


def _llm(**kwargs: object) -> LLM:
    options = {"page_size": PS, "kv_cache_mib": 256, "long_prefill_token_threshold": 256}
    return LLM(model=str(_gemma()), **{**options, **kwargs})  # type: ignore[arg-type]


def test_past_the_window_the_same_bits_as_every_layer_cache() -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for disable in (False, True):
        with _llm(disable_hybrid_kv_cache_manager=disable) as llm:
            assert isinstance(llm.engine.cache_manager, HybridCacheManager) is not disable
            ids = corpus_token_ids(llm.engine.tokenizer, None, 1200)
            prompts = [ids[:1100], ids[300:900]]
            outs = llm.generate(prompts, params, use_tqdm=False)
            runs[disable] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]
    assert runs[False] == runs[True]


def test_conversation_turns_recompute_only_the_new_part() -> None:
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    results = {}
    for caching in (True, False):
        with _llm(enable_prefix_caching=caching) as llm:
            ids = corpus_token_ids(llm.engine.tokenizer, None, 1300)
            turns = [ids[:600], ids[600:900], ids[900:1200]]
            prompt: list[int] = []
            outs = []
            for user in turns:
                prompt = prompt + user
                out = llm.generate([prompt], params, use_tqdm=False)[0]
                outs.append((out.num_cached_tokens, list(out.outputs[0].token_ids)))
                prompt = prompt + list(out.outputs[0].token_ids)
        results[caching] = outs
    assert [t for _, t in results[True]] == [t for _, t in results[False]]
    # each turn reuses the KV the last one wrote (its prompt and answer but the answer's last
    # token), in whole pages of 16
    lens = [600, 600 + 16 + 300]
    assert [c for c, _ in results[True]] == [0] + [(n + 16 - 1) // PS * PS for n in lens]
