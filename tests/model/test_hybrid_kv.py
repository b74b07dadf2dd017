"""The hybrid KV cache on a tiny Gemma 3 (5 sliding-window layers of window 8, 1 full layer,
pages of 4 tokens): greedy text equals transformers and the every-layer cache bitwise, the
sliding layers keep only their window's pages, and a conversation's later turns reuse the
earlier ones through both layer groups."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.cache.hybrid_manager import HybridCacheManager, group_namespace
from pagedattn.engine.llm import LLM
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from tests.model.conftest import hf_greedy
from tests.model.families import WINDOW, hf_model, save_folder

PS = 4
NEW = 16


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> dict[str, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("gemma3-hybrid")
    tokenizer_json = root / "tokenizer.json"
    load_model(tiny_gguf).tokenizer.backend.save(str(tokenizer_json))
    hf = hf_model("gemma3")
    return {"hf": hf, "folder": str(save_folder(hf, root / "hf", tokenizer_json))}


def _prompt(seed: int, length: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 272, length)]


def _llm(gemma: dict[str, Any], **kwargs: Any) -> LLM:
    options = {"page_size": PS, "num_pages": 128, "max_num_batched_tokens": 8, **kwargs}
    return LLM(model=gemma["folder"], **options)


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[Any]:
    return [o.outputs[0] for o in llm.generate(prompts, params)]


def test_greedy_and_logprobs_equal_transformers_and_every_layer_cache(
    gemma: dict[str, Any],
) -> None:
    prompts = [_prompt(2, 43), _prompt(3, 2 * WINDOW + 1), _prompt(4, 30)]
    want = [hf_greedy(gemma["hf"], p, NEW) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=3)
    with _llm(gemma) as llm:
        assert isinstance(llm.engine.cache_manager, HybridCacheManager)
        batched = _run(llm, prompts, params)
        solo = [_run(llm, [p], params)[0] for p in prompts]
    with _llm(gemma, disable_hybrid_kv_cache_manager=True) as llm:
        assert not isinstance(llm.engine.cache_manager, HybridCacheManager)
        every = _run(llm, prompts, params)
    assert [o.token_ids for o in batched] == want
    assert [o.token_ids for o in solo] == want
    assert [o.token_ids for o in every] == want
    for ours, theirs in zip([*batched, *solo], [*every, *every], strict=True):
        assert ours.cumulative_logprob == theirs.cumulative_logprob  # bitwise
        assert ours.logprobs == theirs.logprobs


def test_sliding_layers_hold_only_their_window(gemma: dict[str, Any]) -> None:
    prompt, max_tokens = _prompt(5, 60), 40
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    peaks = []
    for disable in (False, True):
        chunks = {"long_prefill_token_threshold": 8}  # prompt chunks of 8 tokens
        with _llm(gemma, disable_hybrid_kv_cache_manager=disable, **chunks) as llm:
            engine = llm.engine
            cache = engine.cache_manager
            engine.add_request(prompt, params)
            peak = [0, 0]
            while engine.has_unfinished_requests():
                engine.step()
                held = (
                    cache.group_resident_pages()
                    if isinstance(cache, HybridCacheManager)
                    else (cache.num_pages - cache.allocator.num_free_pages,) * 2
                )
                peak = [max(a, b) for a, b in zip(peak, held, strict=True)]
            peaks.append(peak)
    kv_tokens = len(prompt) + max_tokens - 1  # the last token's KV is never computed
    full_pages = -(-kv_tokens // PS)
    # A chunk of 8 new tokens from position n (a multiple of 8) sees keys from n - 7: pages
    # (n - 7) // 4 .. (n + 7) // 4, 4 pages of 4; a decode step at n pages (n - 7) // 4 ..
    # n // 4, at most 3.
    assert peaks[0] == [full_pages, 4]
    assert peaks[1] == [full_pages, full_pages]


def test_conversation_turns_reuse_both_groups(gemma: dict[str, Any]) -> None:
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    turns = [_prompt(6, 40), _prompt(7, 10), _prompt(8, 12)]
    results = {}
    for caching in (True, False):
        prompt: list[int] = []
        outs = []
        with _llm(gemma, enable_prefix_caching=caching) as llm:
            for user in turns:
                prompt = prompt + user
                out = llm.generate([prompt], params)[0]
                outs.append((out.num_cached_tokens, list(out.outputs[0].token_ids)))
                prompt = prompt + list(out.outputs[0].token_ids)
        results[caching] = outs
    assert [t for _, t in results[True]] == [t for _, t in results[False]]
    # Turn k reuses the KV turn k - 1 wrote (its prompt and answer but the answer's last
    # token), in whole pages.
    prompt_lens = [40, 40 + NEW + 10, 40 + 2 * NEW + 22]
    want = [0] + [(n + NEW - 1) // PS * PS for n in prompt_lens[:-1]]
    assert [c for c, _ in results[True]] == want
    assert [c for c, _ in results[False]] == [0, 0, 0]


def test_n2_children_and_preemption_equal_the_every_layer_cache(gemma: dict[str, Any]) -> None:
    prompts = [_prompt(9 + i, 30) for i in range(3)]
    params = [
        SamplingParams(temperature=0.8, seed=i, n=2, max_tokens=20, ignore_eos=True)
        for i in range(3)
    ]
    runs = {}
    for disable in (False, True):
        with _llm(gemma, num_pages=24, max_num_seqs=4,
                  disable_hybrid_kv_cache_manager=disable) as llm:  # fmt: skip
            outs = llm.generate(prompts, params)
            runs[disable] = [[list(c.token_ids) for c in o.outputs] for o in outs]
            assert llm.engine.scheduler.stats.num_preemptions > 0
            llm.engine.cache_manager.check_integrity()
            if not disable:  # a group's layers wrote only its own page ids (children included)
                cache, kv = llm.engine.cache_manager, llm.engine.page_pool.kv
                assert isinstance(cache, HybridCacheManager)
                for group, base, n in zip(
                    llm.engine.kv_layout.groups, cache.bases, cache.group_num_pages, strict=True
                ):
                    rows = kv[np.asarray(group.layers)]
                    assert rows[:, :, base : base + n].any()
                    assert not rows[:, :, :base].any() and not rows[:, :, base + n :].any()
        if not disable:
            with _llm(gemma, num_pages=24) as llm:
                solo = [
                    [list(c.token_ids) for c in llm.generate([p], q)[0].outputs]
                    for p, q in zip(prompts, params, strict=True)
                ]
    assert runs[False] == runs[True] == solo


def test_user_window_and_sinks_apply_to_both_groups(gemma: dict[str, Any]) -> None:
    prompts = [_prompt(12, 50), _prompt(13, 21)]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=2)
    runs = {}
    for disable in (False, True):
        with _llm(gemma, sliding_window=12, num_sink_tokens=4,
                  disable_hybrid_kv_cache_manager=disable) as llm:  # fmt: skip
            cache = llm.engine.cache_manager
            if not disable:
                assert isinstance(cache, HybridCacheManager)
                assert cache.windows == (12, WINDOW)  # the full layers take the user's window
            runs[disable] = [(o.token_ids, o.logprobs) for o in _run(llm, prompts, params)]
    assert runs[False] == runs[True]


def test_shifted_positions_are_refused_on_a_sliding_model(gemma: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"--position-mode shifted with --sliding-window 12"):
        _llm(gemma, sliding_window=12, position_mode="shifted")


def test_speculative_drafts_keep_the_window_of_the_step_token(gemma: dict[str, Any]) -> None:
    # The tiny model's greedy text soon repeats itself, so the n-gram drafter proposes (and the
    # model accepts) drafts: a verify step reserves the step token and then its drafts, and the
    # step token's own query still sees the oldest page of its window.
    prompts = [_prompt(seed, 20) for seed in range(9, 13)]
    want = [hf_greedy(gemma["hf"], p, 40) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    runs = {}
    for disable in (False, True):
        with _llm(gemma, speculative="ngram", max_num_batched_tokens=64,
                  disable_hybrid_kv_cache_manager=disable) as llm:  # fmt: skip
            outs = [_run(llm, [p], params)[0] for p in prompts]
            runs[disable] = [(o.token_ids, o.logprobs) for o in outs]
            assert llm.engine.get_stats()["spec_num_accepted_tokens"] > 40
    assert [t for t, _ in runs[False]] == want
    assert runs[False] == runs[True]


def test_persistent_tier_restores_both_groups_after_a_restart(
    gemma: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "kv"
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=2)
    first = _prompt(16, 60)
    tail = _prompt(17, 10)
    with _llm(gemma, kv_store=str(store)) as llm:
        answer = list(_run(llm, [first], params)[0].token_ids)
    second = first + answer + tail
    # each layer group's records under its own namespace
    assert len([p for p in (store / "kv").iterdir() if p.is_dir()]) == 2
    with _llm(gemma) as llm:  # the same turns with an in-memory prefix hit
        _run(llm, [first], params)
        warm = llm.generate([second], params)[0]
    with _llm(gemma, enable_prefix_caching=False) as cold:
        want = _run(cold, [second], params)[0]
    with _llm(gemma, kv_store=str(store)) as llm:  # a new engine: an empty pool
        out = llm.generate([second], params)[0]
        restored = llm.engine.cache_manager.tier_restored_tokens
        namespace = llm.engine.namespace
    # the KV the first request wrote: its prompt and answer but the answer's last token
    hit = (len(first) + NEW - 1) // PS * PS
    assert out.num_cached_tokens == warm.num_cached_tokens == restored == hit
    assert out.outputs[0].token_ids == want.token_ids  # the cold run's text
    # the restored pages of both groups hold the very bits the first engine computed
    assert out.outputs[0].logprobs == warm.outputs[0].logprobs
    # without the sliding layers' records the full layers' alone are no hit
    shutil.rmtree(store / "kv" / group_namespace(namespace, 1, WINDOW).hex())
    with _llm(gemma, kv_store=str(store)) as llm:
        out = llm.generate([second], params)[0]
        assert out.num_cached_tokens == 0
        llm.engine.cache_manager.check_integrity()
    assert out.outputs[0].token_ids == want.token_ids


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_half_and_int8_pages_equal_the_every_layer_cache(gemma: dict[str, Any], dtype: str) -> None:
    prompts = [_prompt(18, 43), _prompt(19, 25)]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=2)
    runs = {}
    for disable in (False, True):
        with _llm(gemma, kv_cache_dtype=dtype, disable_hybrid_kv_cache_manager=disable) as llm:
            runs[disable] = [(o.token_ids, o.logprobs) for o in _run(llm, prompts, params)]
    assert runs[False] == runs[True]
