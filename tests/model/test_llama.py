"""LlamaModel.forward over paged KV: equal to HF transformers, and paged decode == prefill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import LoadedModel, load_model
from tests.model.conftest import hf_greedy, hf_logits
from tests.model.paging import PagedSequences, greedy
from tests.model.tiny import random_hf_llama

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory, tiny_loaded: LoadedModel) -> tuple[Any, Path]:
    """A tiny random HF LlamaForCausalLM saved with safetensors, plus its folder."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model: Any = random_hf_llama(tie_word_embeddings=True, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("tiny_hf")
    model.save_pretrained(folder, safe_serialization=True)
    tiny_loaded.tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return model, folder


def test_hf_folder_logits_match_transformers(tiny_hf: tuple[Any, Path]) -> None:
    hf, folder = tiny_hf
    loaded = load_model(folder)
    model = LlamaModel(loaded.config, loaded.weights)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, loaded.config.vocab_size, 40)]
    state = PagedSequences(model, num_pages=8, page_size=16)
    ours = state.all_logits(state.new_sequence(), ids)
    np.testing.assert_allclose(ours, hf_logits(hf, ids), rtol=0, atol=1e-4)
    assert greedy(model, ids[:6], 24) == hf_greedy(hf, ids[:6], 24)


def _teacher_forced(model: LlamaModel, ids: list[int], chunks: list[int]) -> np.ndarray:
    """Prefill in ``chunks`` (sizes), then decode the rest one token per step; all logits."""
    state = PagedSequences(model, num_pages=16, page_size=16, seed=3)
    seq = state.new_sequence()
    rows, start = [], 0
    for size in chunks:
        rows.append(state.all_logits(seq, ids[start : start + size]))
        start += size
    for token in ids[start:]:
        rows.append(state.step({seq: [token]}))
    return np.concatenate(rows)


@pytest.mark.parametrize("prompt_len", [15, 16, 17])
def test_paged_decode_equals_one_prefill(tiny_model: LlamaModel, prompt_len: int) -> None:
    ids = [int(i) for i in np.random.default_rng(prompt_len).integers(3, 272, prompt_len + 20)]
    reference = _teacher_forced(tiny_model, ids, [len(ids)])
    decoded = _teacher_forced(tiny_model, ids, [prompt_len])
    np.testing.assert_allclose(decoded, reference, rtol=0, atol=1e-4)
    chunked = _teacher_forced(tiny_model, ids, [7, prompt_len - 7, 13])  # splits mid-page
    np.testing.assert_allclose(chunked, reference, rtol=0, atol=1e-4)


def test_batched_sequences_equal_single_runs(tiny_model: LlamaModel) -> None:
    rng = np.random.default_rng(1)
    prompts = [[int(i) for i in rng.integers(3, 272, n)] for n in (5, 17, 33)]
    single = []
    for prompt in prompts:
        state = PagedSequences(tiny_model, num_pages=8, page_size=16)
        single.append(state.step({state.new_sequence(): prompt})[0])
    state = PagedSequences(tiny_model, num_pages=16, page_size=16)
    seqs = [state.new_sequence() for _ in prompts]
    batched = state.step(dict(zip(seqs, prompts, strict=True)))
    np.testing.assert_allclose(batched, np.stack(single), rtol=0, atol=1e-5)
    step = state.step({s: [7] for s in seqs})  # one decode batch over three sequences
    assert step.shape == (3, 272) and np.isfinite(step).all()


def test_shifted_mode_scores_sink_keys_at_their_in_cache_distance(
    tiny_model: LlamaModel,
) -> None:
    """Decode position 20 with W=8, S=2 in shifted mode (sink queries rotated to the in-cache
    position 9): equal to absolute mode over a pool whose sink keys were re-rotated by +11,
    i.e. moved to the same query distance (llama.cpp's context shift; RoPE composes:
    R(j + 11) k = R(11) R(j) k) -- and different from plain absolute mode."""
    from tests.engine.helpers import _rope

    c = tiny_model.config
    state = PagedSequences(tiny_model, num_pages=4, page_size=16)
    seq = state.new_sequence()
    state.step({seq: list(range(3, 23))})  # positions 0..19 written
    slot = state._slots(seq, 1)  # position 20
    state.lens[seq] += 1
    sink_slots = np.array(state.tables[seq][0] * 16 + np.arange(2))  # positions 0, 1

    def decode(kv: np.ndarray, sink_positions: np.ndarray | None) -> np.ndarray:
        batch = ForwardBatch(
            input_ids=np.array([7], np.int64),
            positions=np.array([20], np.int64),
            slot_mapping=np.array(slot, np.int64),
            query_start_loc=np.array([0, 1], np.int32),
            context_lens=np.array([21], np.int32),
            page_tables=np.array([state.tables[seq]], np.int32),
            logits_indices=np.array([0], np.int64),
            sliding_window=8,
            num_sink_tokens=2,
            sink_positions=sink_positions,
        )
        return np.asarray(tiny_model.forward(batch, kv))

    shifted = decode(state.kv.copy(), np.array([9], np.int64))
    absolute = decode(state.kv.copy(), None)
    moved = state.kv.copy()
    keys = moved[:, 0].reshape(c.num_layers, -1, c.num_kv_heads, 16, c.head_dim)
    for layer in range(c.num_layers):
        page, off = divmod(sink_slots, 16)
        k = keys[layer, page, :, off]  # (2, nkv, D)
        keys[layer, page, :, off] = _rope(k, np.full(2, 11), c.rope_theta)
    oracle = decode(moved, None)
    np.testing.assert_allclose(shifted, oracle, rtol=0, atol=1e-4)
    assert np.abs(shifted - absolute).max() > 1e-3  # the sink rotation matters


def test_bad_kv_pool_and_ids_are_refused(tiny_model: LlamaModel) -> None:
    state = PagedSequences(tiny_model, num_pages=2, page_size=16)
    seq = state.new_sequence()
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 272\)"):
        state.step({seq: [272]})
    state.kv = np.zeros((2, 2, 2, 3, 16, 16), np.float32)
    expected = r"kv: expected C-contiguous float32, float16 or int8 \(num_layers=2"
    with pytest.raises(ValueError, match=expected):
        state.step({seq: [5]})


@pytest.mark.model
@pytest.mark.hf
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_greedy_matches_hf_generate(
    real_loaded: LoadedModel, real_model: LlamaModel, hf_reference: tuple[Any, Any], kind: str
) -> None:
    tok = real_loaded.tokenizer
    prompt = tok.encode_chat(CHAT) if kind == "chat" else tok.encode("The capital of France is")
    ours = greedy(real_model, prompt, 32)
    assert ours == hf_greedy(hf_reference[0], prompt, 32)
    if kind == "chat":
        assert tok.decode(ours[: ours.index(2)]) == "The capital of France is Paris."


@pytest.mark.model
@pytest.mark.hf
def test_last_position_logits_match_hf(
    real_loaded: LoadedModel, real_model: LlamaModel, hf_reference: tuple[Any, Any]
) -> None:
    text = "Paged attention stores the KV cache in fixed-size pages. " * 10
    ids = real_loaded.tokenizer.encode(text)[:100]
    assert len(ids) == 100
    state = PagedSequences(real_model, num_pages=8, page_size=16)
    ours = state.step({state.new_sequence(): ids})[0]
    np.testing.assert_allclose(ours, hf_logits(hf_reference[0], ids)[-1], rtol=0, atol=1e-3)
