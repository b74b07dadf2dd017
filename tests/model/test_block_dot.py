"""The explicit-SIMD block kernels: one lane order for every kernel and row count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.kernels.aligned import aligned
from pagedattn.model import block_dot, block_tiles
from pagedattn.model.block_ir import KINDS, kind_set, kinds_of
from pagedattn.model.gelu_ops import gelu_mul
from pagedattn.model.quantized import from_gguf_blocks, qmatmul
from pagedattn.model.row_ops import rms_norm, silu_mul
from tests.model.random_blocks import random_blocks


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
    block_dot.qmatmul_blocks(x, b, b, b, (k, k, k), kind_set({k}), 1, in_registers)
    block_tiles.qmatmul_tiled(*args, from_scratch)
    np.testing.assert_array_equal(in_registers, from_scratch)
    # the float32 kernel, fed gguf's own dequantized weights, does the same operations
    dense = np.full((rows, out), np.nan, np.float32)
    block_tiles.matmul_float(x, block.dequantize(), dense)
    np.testing.assert_array_equal(dense, in_registers)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("blocks", [50, 65])  # 1,600 and 2,080 inputs: span by span
def test_long_rows_in_spans_keep_the_register_kernels_bits(qtype: Q, blocks: int) -> None:
    rows, out = 2 * block_tiles.TILE_T + 3, 3 * block_tiles.TILE_N + 3  # with both tails
    assert 32 * blocks // 16 > block_tiles.SPAN_MIN_STEPS
    block, x = _case(qtype, out, blocks, rows, blocks)
    b, k = block.blocks, block.kind
    in_registers = np.full((rows, out), np.nan, np.float32)
    block_dot.qmatmul_blocks(x, b, b, b, (k, k, k), kind_set({k}), 1, in_registers)
    from_scratch = np.full((rows, out), np.nan, np.float32)
    block_tiles.qmatmul_tiled(aligned(x), b, k, from_scratch)
    np.testing.assert_array_equal(from_scratch, in_registers)
    dense = np.full((rows, out), np.nan, np.float32)
    block_tiles.matmul_float(aligned(x), block.dequantize(), dense)
    np.testing.assert_array_equal(dense, in_registers)


@pytest.mark.parametrize("offset", [0, 4, 8, 12])  # floats past a cache line
def test_activations_meet_the_tiles_on_a_cache_line_with_the_same_values(offset: int) -> None:
    block, x = _case(Q.Q4_1, 20, 4, 40, offset)  # 40 rows: the tiles
    buf = np.empty(x.size + 32, np.float32)
    first = (64 - buf.ctypes.data % 64) % 64 // 4 + offset
    shifted = buf[first : first + x.size].reshape(x.shape)
    shifted[...] = x
    assert shifted.ctypes.data % 64 == 4 * offset
    lined = aligned(shifted)
    assert lined.ctypes.data % 64 == 0 and lined.shape == x.shape
    assert (lined is shifted) == (offset == 0)
    np.testing.assert_array_equal(lined, x)
    # the product does not depend on where x sits (the tiles get a lined-up copy)
    np.testing.assert_array_equal(qmatmul(shifted, block), qmatmul(x, block))


def test_the_activations_a_matmul_reads_are_made_on_a_cache_line() -> None:
    """Norms, gated activations and matmuls write their outputs where the next matmul's tiles
    want them, so that it copies nothing."""
    block, x = _case(Q.Q4_1, 64, 4, 40, 1)
    gate_up = np.random.default_rng(1).standard_normal((40, 2 * 96)).astype(np.float32)
    outs = {
        "rms_norm": rms_norm(x, np.ones(x.shape[1], np.float32), 1e-5),
        "silu_mul": silu_mul(gate_up),
        "gelu_mul": gelu_mul(gate_up),
        "qmatmul": qmatmul(x, block),
    }
    assert {name: out.ctypes.data % 64 for name, out in outs.items()} == dict.fromkeys(outs, 0)


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
    (mixed kinds included, on either path), and the float32 path matches
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


def test_a_kind_set_names_its_kinds_in_its_type_and_refuses_others() -> None:
    import numba

    marker = kind_set({KINDS["Q6_K"], KINDS["Q4_1"]})
    assert set(kinds_of(numba.typeof(marker))) >= {1, 7}  # all kinds in the suite (conftest)
    assert marker.size == 0 and not marker.flags.writeable
    assert kind_set([7, 1]) is marker  # one array (and one compiled kernel) per set
    with pytest.raises(ValueError, match="kind set"):
        kind_set({99})
    with pytest.raises(ValueError, match="kind set"):  # Q5_K: the kernels read Q5_1 blocks
        kind_set({KINDS["Q5_K"]})
    with pytest.raises(ValueError, match="kind set"):
        kind_set(())


_OWN_KINDS = """
import sys
import numba, numpy as np
from pagedattn.model import block_dot
from pagedattn.model.block_ir import kinds_of
from pagedattn.model.quantized import from_gguf_blocks, qmatmul
data = np.load(sys.argv[1])
out = {}
for name in ("Q8_0", "Q6_K"):
    w = from_gguf_blocks(data[name], name, tuple(data[name + "_shape"]))
    out[name] = qmatmul(data["x"], w)
print(sorted(kinds_of(sig[5]) for sig in block_dot.qmatmul_blocks.signatures))
np.savez(sys.argv[1], **out)
"""


@pytest.mark.slow  # compiles two block kernels
def test_by_default_a_kernel_holds_its_kinds_only_with_the_same_bits(tmp_path: Path) -> None:
    """Without the suite's one-kernel setting, a matrix's kernel is compiled for its own kind
    alone (a model's: for the model's kinds), and computes the bits of the every-kind kernel."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    arrays: dict[str, np.ndarray] = {"x": x}
    want = {}
    for qtype in (Q.Q8_0, Q.Q6_K):
        raw = random_blocks(qtype, (24, 512), rng)
        arrays[qtype.name], arrays[qtype.name + "_shape"] = raw, np.array([24, 512])
        want[qtype.name] = qmatmul(x, from_gguf_blocks(raw, qtype.name, (24, 512)))
    path = tmp_path / "case.npz"
    np.savez(path, **arrays)
    env = {k: v for k, v in os.environ.items() if k != "PAGEDATTN_ALL_BLOCK_KINDS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", _OWN_KINDS, str(path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[(2,), (7,)]"  # Q8_0 alone, Q6_K alone
    got = np.load(path)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
