"""The explicit-SIMD block kernels: one lane order for every kernel and row count."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.model import block_dot, block_tiles
from pagedattn.model.quantized import from_gguf_blocks, qmatmul


def _case(qtype: Q, out: int, blocks: int, rows: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, 32 * blocks)).astype(np.float32)
    block = from_gguf_blocks(quantize(w, qtype), qtype.name, (out, 32 * blocks))
    x = rng.standard_normal((rows, 32 * blocks)).astype(np.float32)
    return block, x


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 70),  # across TILE_T tails
    out=st.integers(1, 40),  # across DECODE_TILE, TILE_N and ROWS_PER_TASK tails
    blocks=st.integers(1, 6),
    qtype=st.sampled_from([Q.Q4_0, Q.Q4_1, Q.Q8_0]),
    seed=st.integers(0, 2**16),
)
def test_register_and_scratch_kernels_agree_bitwise(
    rows: int, out: int, blocks: int, qtype: Q, seed: int
) -> None:
    block, x = _case(qtype, out, blocks, rows, seed)
    args = (x, block.blocks, block.kind)
    in_registers = np.full((rows, out), np.nan, np.float32)
    from_scratch = np.full((rows, out), np.nan, np.float32)
    b, k = block.blocks, block.kind
    block_dot.qmatmul_blocks(x, b, b, b, (k, k, k), 1, in_registers)
    block_tiles.qmatmul_tiled(*args, from_scratch)
    np.testing.assert_array_equal(in_registers, from_scratch)
    # the float32 kernel, fed gguf's own dequantized weights, does the same operations
    dense = np.full((rows, out), np.nan, np.float32)
    block_tiles.matmul_float(x, block.dequantize(), dense)
    np.testing.assert_array_equal(dense, in_registers)


def test_long_rows_stay_accurate() -> None:
    """16 lanes of in-order fma, then a halving tree: within float32 round-off of float64 at the
    model's widest input (1,536)."""
    block, x = _case(Q.Q4_1, 64, 48, 3, 0)
    want = x.astype(np.float64) @ block.dequantize().astype(np.float64).T
    got = qmatmul(x, block)
    scale = np.abs(x).astype(np.float64) @ np.abs(block.dequantize()).astype(np.float64).T
    assert np.max(np.abs(got - want) / scale) < 2e-6


def test_float_rows_of_any_width_are_batch_invariant() -> None:
    """in_features not a multiple of LANES takes the plain float kernel, still row-independent."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((20, 40)).astype(np.float32)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    got = qmatmul(x, w)
    np.testing.assert_allclose(
        got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    for t in range(5):
        np.testing.assert_array_equal(qmatmul(x[t : t + 1], w)[0], got[t])


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 2),  # a decode step: the parts share one launch
    outs=st.lists(st.integers(1, 40), min_size=2, max_size=3),
    blocks=st.integers(1, 4),
    qtypes=st.lists(st.sampled_from([Q.Q4_0, Q.Q4_1, Q.Q8_0]), min_size=3, max_size=3),
    activations=st.sampled_from(["float32", "int8"]),
    seed=st.integers(0, 2**16),
)
def test_parts_in_one_launch_equal_each_part_alone(
    rows: int, outs: list[int], blocks: int, qtypes: list[Q], activations: str, seed: int
) -> None:
    """q|k|v and gate|up in one launch: each column block is bitwise what that part gives alone
    (mixed kinds included; with int8, Q8_0 parts stay exact), and the float32 path matches
    gguf's dequantized weights in float64."""
    parts = [
        _case(q, n, blocks, rows, seed + i)[0]
        for i, (q, n) in enumerate(zip(qtypes, outs, strict=False))
    ]
    x = _case(Q.Q8_0, 1, blocks, rows, seed)[1]
    got = qmatmul(x, *parts, activations=activations)
    alone = [qmatmul(x, p, activations=activations) for p in parts]
    np.testing.assert_array_equal(got, np.concatenate(alone, axis=1))
    if activations == "float32":
        dense = np.concatenate([p.dequantize() for p in parts]).astype(np.float64)
        np.testing.assert_allclose(got, x.astype(np.float64) @ dense.T, rtol=1e-4, atol=1e-4)
