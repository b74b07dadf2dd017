"""Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) kept as GGUF blocks: their decoded weights are
``gguf``'s bit for bit, their matmuls agree with float64 and are batch-invariant."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.model import block_tiles
from pagedattn.model.quantized import dequantize_rows, from_gguf_blocks, qmatmul
from tests.model.random_blocks import LAYOUTS, NEW_TYPES, random_blocks


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_decoded_weights_equal_gguf_bitwise(qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    shape = (19, 3 * LAYOUTS[qtype][0])
    raw = random_blocks(qtype, shape, rng)
    block = from_gguf_blocks(raw, qtype.name, shape)
    assert block.shape == shape
    # Q6_K (19 rows, not interleaved): the file's bytes; the others a copy with float32 scales,
    # Q5_K as the Q5_1 blocks of its sub-blocks (model/block_repack)
    assert np.shares_memory(block.blocks, raw) == (qtype == Q.Q6_K)
    assert block.type_name == {Q.Q5_K: "Q5_1"}.get(qtype, qtype.name)
    want = dequantize(raw, qtype).reshape(shape)
    np.testing.assert_array_equal(_bits(block.dequantize()), _bits(want))
    rows = np.array([7, 0, 18, 7])  # the embedding lookup decodes only these rows
    np.testing.assert_array_equal(_bits(dequantize_rows(block, rows)), _bits(want[rows]))


@settings(max_examples=30, deadline=None)
@given(
    qtype=st.sampled_from(NEW_TYPES),
    out=st.integers(1, 40),  # across DECODE_TILE, TILE_N and ROWS_PER_TASK tails
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_qmatmul_equals_float64_and_is_batch_invariant(
    qtype: Q, out: int, blocks: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    shape = (out, blocks * LAYOUTS[qtype][0])
    raw = random_blocks(qtype, shape, rng)
    block = from_gguf_blocks(raw, qtype.name, shape)
    dense = dequantize(raw, qtype).reshape(shape).astype(np.float64)
    x = rng.standard_normal((33, shape[1])).astype(np.float32)
    got = qmatmul(x, block)  # 33 rows: the scratch kernel
    want = x.astype(np.float64) @ dense.T
    bound = np.abs(x).astype(np.float64) @ np.abs(dense).T
    assert np.all(np.abs(got - want) <= 2e-6 * bound + 1e-30)
    for t in range(33):  # alone (registers), as the first or second of two rows
        np.testing.assert_array_equal(qmatmul(x[t : t + 1], block)[0], got[t])
        pair = qmatmul(x[[t, (t + 1) % 33]], block)
        np.testing.assert_array_equal(pair[0], got[t])
    for t in (3, 7, 8):  # the decode kernel's other register tiles (two output rows past 6)
        np.testing.assert_array_equal(qmatmul(x[:t], block), got[:t])
    # the float32 kernel, fed gguf's own dequantized weights, does the same operations
    same = np.full(got.shape, np.nan, np.float32)
    block_tiles.matmul_float(x, dense.astype(np.float32), same)
    np.testing.assert_array_equal(same, got)


def test_mixed_parts_share_one_launch() -> None:
    """q|k|v of three different types (as Q4_K_M files mix Q4_K and Q6_K) in one call equal
    each part alone."""
    rng = np.random.default_rng(3)
    parts = []
    for qtype, out in ((Q.Q4_K, 24), (Q.Q6_K, 8), (Q.Q5_K, 8)):
        raw = random_blocks(qtype, (out, 512), rng)
        parts.append(from_gguf_blocks(raw, qtype.name, (out, 512)))
    for rows in (1, 2, 5):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        together = qmatmul(x, *parts)
        alone = np.concatenate([qmatmul(x, p) for p in parts], axis=1)
        np.testing.assert_array_equal(together, alone)


def test_int8_activations_take_every_k_quant() -> None:
    """int8 activations apply to every block type: Q4_K, Q5_K (held as Q5_1) and Q6_K;
    a Q6_K part beside a Q5_K one in one launch gives each part's own int8 values, near the
    exact path's and not equal to them."""
    pytest.importorskip("pagedattn.model.block_dot_int8")
    from pagedattn.model.int8_ir import int8_unsupported

    if int8_unsupported() is not None:
        pytest.skip("int8 activations need AVX2")
    rng = np.random.default_rng(4)
    k5 = from_gguf_blocks(random_blocks(Q.Q5_K, (16, 256), rng), "Q5_K", (16, 256))
    k6 = from_gguf_blocks(random_blocks(Q.Q6_K, (8, 256), rng), "Q6_K", (8, 256))
    x = rng.standard_normal((2, 256)).astype(np.float32)
    mixed = qmatmul(x, k6, k5, activations="int8")
    np.testing.assert_array_equal(mixed[:, :8], qmatmul(x, k6, activations="int8"))
    np.testing.assert_array_equal(mixed[:, 8:], qmatmul(x, k5, activations="int8"))
    for part, w in ((mixed[:, :8], k6), (mixed[:, 8:], k5)):
        exact = qmatmul(x, w)
        assert not np.array_equal(part, exact)  # the int8 path
        assert np.abs(part - exact).max() < 0.02 * np.abs(exact).max()
