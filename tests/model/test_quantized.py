"""Block-quantized weights: exact block form of GGUF tensors, and qmatmul == x @ w.T."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import LoadedModel, load_model
from pagedattn.model.quantized import from_gguf_blocks, qmatmul
from tests.model.paging import PagedSequences
from tests.model.random_blocks import blocks_by_row
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_block_form_dequantizes_bit_exactly(qtype: Q) -> None:
    w = np.random.default_rng(0).standard_normal((40, 96)).astype(np.float32)
    raw = quantize(w, qtype)
    block = from_gguf_blocks(raw, qtype.name, (40, 96))
    np.testing.assert_array_equal(block.dequantize(), dequantize(raw, qtype).reshape(40, 96))
    assert block.blocks.dtype == np.uint8 and block.shape == (40, 96)
    # the kernels' layout: the float16 scale widened to float32, then the codes as in the file
    file_blocks = raw.reshape(40, 3, -1)
    kernel_blocks = blocks_by_row(block.blocks, block.blocks.shape[1] // 3)
    scales = np.ascontiguousarray(file_blocks[:, :, :2]).view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(
        np.ascontiguousarray(kernel_blocks[:, :, :4]).view(np.float32), scales
    )
    header = 4 if qtype == Q.Q4_1 else 2  # Q4_1's float16 minimum follows its scale
    np.testing.assert_array_equal(kernel_blocks[:, :, 2 * header :], file_blocks[:, :, header:])


@given(
    rows=st.integers(1, 40),
    out=st.integers(1, 70),
    blocks=st.integers(1, 4),
    qtype=st.sampled_from([Q.Q4_0, Q.Q4_1, Q.Q8_0]),
    seed=st.integers(0, 2**16),
)
def test_qmatmul_equals_dense_matmul(rows: int, out: int, blocks: int, qtype: Q, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, 32 * blocks)).astype(np.float32)
    block = from_gguf_blocks(quantize(w, qtype), qtype.name, (out, 32 * blocks))
    x = rng.standard_normal((rows, 32 * blocks)).astype(np.float32)
    want = x.astype(np.float64) @ block.dequantize().astype(np.float64).T
    got = qmatmul(x, block)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for t in range(rows):  # each row bitwise the same computed alone (batch invariance)
        np.testing.assert_array_equal(qmatmul(x[t : t + 1], block)[0], got[t])
    halves = qmatmul(x, block, block)  # two parts side by side, as the fused q|k|v call
    np.testing.assert_array_equal(halves, np.concatenate([got, got], axis=1))


def test_bad_shapes_are_refused() -> None:
    block = from_gguf_blocks(np.zeros(68, np.uint8), "Q8_0", (2, 32))
    with pytest.raises(ValueError, match=r"x: expected \(num_tokens, 32\)"):
        qmatmul(np.zeros((1, 64), np.float32), block)
    with pytest.raises(ValueError, match="does not match shape"):
        from_gguf_blocks(np.zeros(10, np.uint8), "Q8_0", (2, 32))
    with pytest.raises(ValueError, match="block type 'Q2_K' not supported"):
        from_gguf_blocks(np.zeros(10, np.uint8), "Q2_K", (2, 32))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_quantized_decode_equals_float32_decode(tmp_path: Path, qtype: Q) -> None:
    config = tiny_config()
    loaded = load_model(
        write_tiny_gguf(tmp_path / "q.gguf", config, random_weights(config), qtype=qtype)
    )
    assert set(loaded.quantized) == {k for k, v in loaded.weights.items() if v.ndim == 2}
    for name, block in loaded.quantized.items():  # q/k rows un-permuted like the float weights
        np.testing.assert_array_equal(block.dequantize(), loaded.weights[name], err_msg=name)
    logits = []
    for model in (
        LlamaModel(config, loaded.weights, loaded.quantized),
        LlamaModel(config, loaded.weights),
    ):
        state = PagedSequences(model, num_pages=4, page_size=16)
        seq = state.new_sequence()
        state.step({seq: list(range(10, 30))})
        logits.append(np.concatenate([state.step({seq: [t]}) for t in (40, 50, 60)]))
    np.testing.assert_allclose(logits[0], logits[1], rtol=0, atol=1e-4)


@pytest.mark.model
def test_real_model_block_forms_are_exact(real_loaded: LoadedModel) -> None:
    assert len(real_loaded.quantized) == 30 * 7 + 1  # every linear + the Q8_0 embedding
    for name in (
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.29.self_attn.k_proj.weight",
    ):
        block = real_loaded.quantized[name]
        np.testing.assert_array_equal(block.dequantize(), real_loaded.weights[name])
