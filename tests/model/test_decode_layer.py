"""The fused decode step (one compiled call per layer) is bitwise the step-by-step forward: the
same logits and the same K/V written, on both activation paths and KV dtypes, with
flash-decoding splits, a sliding window and sink tokens; and it is the path a decode step of
up to FUSED_MAX_ROWS rows takes (several sequences, or one sequence's verify rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import pagedattn.model.decoder as llama
from pagedattn.kernels import paged
from pagedattn.kernels.target import has_avx2
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

PAGE = 4


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    path = tmp_path_factory.mktemp("fused") / "tiny-q4_1.gguf"
    return write_tiny_gguf(path, config, random_weights(config, seed=3), qtype=Q.Q4_1)


def _batch(
    chunks: list[tuple[list[int], int, np.ndarray]], window: int | None, sinks: int
) -> ForwardBatch:
    """chunks: (token ids, first position, page table) of each sequence's new tokens."""
    ids, pos, slots, qsl = [], [], [], [0]
    for tokens, start, table in chunks:
        ids += tokens
        pos += range(start, start + len(tokens))
        slots += [int(table[p // PAGE]) * PAGE + p % PAGE for p in pos[-len(tokens) :]]
        qsl.append(qsl[-1] + len(tokens))
    return ForwardBatch(
        input_ids=np.array(ids, np.int64),
        positions=np.array(pos, np.int64),
        slot_mapping=np.array(slots, np.int64),
        query_start_loc=np.array(qsl, np.int32),
        context_lens=np.array([s + len(t) for t, s, _ in chunks], np.int32),
        page_tables=np.stack([table for _, _, table in chunks]).astype(np.int32),
        logits_indices=np.array(qsl[1:], np.int64) - 1,
        sliding_window=window,
        num_sink_tokens=sinks,
    )


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize("activations", ["float32", "int8"])
@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (7, 2)])
def test_fused_decode_equals_the_step_by_step_forward(
    q4_gguf: Path,
    monkeypatch: pytest.MonkeyPatch,
    activations: str,
    window: int | None,
    sinks: int,
    kv_dtype: str,
) -> None:
    if activations == "int8" and not has_avx2():
        pytest.skip("int8 activations need AVX2")
    monkeypatch.setattr(paged, "SPLIT_MIN_KEYS", 4)  # several splits per sequence, merged
    loaded = load_model(q4_gguf)
    fused = LlamaModel.from_loaded(loaded, activations)
    plain = LlamaModel(
        loaded.config, loaded.weights, loaded.quantized, activations, fused_decode=False
    )
    calls = []
    real = llama.decode_layer
    monkeypatch.setattr(llama, "decode_layer", lambda *a: calls.append(a[0].shape) or real(*a))
    rng = np.random.default_rng(5)
    vocab = loaded.config.vocab_size
    tokens = [rng.integers(0, vocab, n).tolist() for n in (22, 13)]
    # 10 pages each: 22 prompt tokens + up to 14 decode rows fit on any host's widest step
    tables = [rng.permutation(16)[:10], rng.permutation(np.arange(16, 32))[:10]]
    kv = {m: np.zeros(fused.kv_shape(32, PAGE), kv_dtype) for m in ("fused", "plain")}
    lens = [len(t) for t in tokens]
    prefill = _batch([(tokens[s], 0, tables[s]) for s in range(2)], window, sinks)
    for name, model in (("fused", fused), ("plain", plain)):
        model.forward(prefill, kv[name])
    assert not calls  # a prefill step takes the general path
    # one row per sequence; then a sequence's verify rows (one row per position, as
    # speculative decoding lays them out) beside another sequence's row: 9 rows (two register
    # groups with 32 registers), or FUSED_MAX_ROWS, the most the fused path takes; then 3
    wide = min(9, llama.FUSED_MAX_ROWS)
    steps = [(0, 1), (1,), (0, 1), (0,), (0,) * (wide - 1) + (1,), (1, 1, 1)]
    for step, seqs in enumerate(steps):
        rows = []
        for i, s in enumerate(seqs):
            rows.append(([int(rng.integers(0, vocab))], lens[s] + seqs[:i].count(s), tables[s]))
        batch = _batch(rows, window, sinks)
        got = fused.forward(batch, kv["fused"])
        want = plain.forward(batch, kv["plain"])
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
        np.testing.assert_array_equal(kv["fused"], kv["plain"], err_msg=f"KV, step {step}")
        assert calls[-1] == (len(seqs), loaded.config.hidden_size)
        for s in seqs:
            lens[s] += 1
    assert len(calls) == len(steps) * loaded.config.num_layers
