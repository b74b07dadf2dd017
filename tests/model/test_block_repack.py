"""The kernels' layout of the 32-input block formats (model/block_repack.py): each float16
header field widened to float32 (NumPy's conversion as the oracle, every bit pattern
included), the rest of each block unchanged, rows interleaved in groups of four where their
count allows; K-quant rows in any other count are left as the file's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.model.block_ir import FILE_SHAPES, KINDS, SHAPES
from pagedattn.model.block_repack import repack_blocks
from tests.model.random_blocks import blocks_by_row

# kind -> float16 fields at the start of its blocks (ggml-common.h: d; d and m for Q4_1, Q5_1)
FIELDS = {KINDS["Q4_0"]: 1, KINDS["Q4_1"]: 2, KINDS["Q8_0"]: 1, KINDS["Q5_0"]: 1, KINDS["Q5_1"]: 2}


@given(
    kind=st.sampled_from(sorted(FIELDS)),
    rows=st.integers(1, 9),
    blocks=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_header_fields_widen_exactly_and_the_rest_is_copied(
    kind: int, rows: int, blocks: int, seed: int
) -> None:
    size, fields = FILE_SHAPES[kind][1], FIELDS[kind]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, blocks * size), dtype=np.uint8)
    out = repack_blocks(raw, kind)
    assert out.shape == (rows, blocks * SHAPES[kind][1]) and out.dtype == np.uint8
    assert SHAPES[kind][1] == size + 2 * fields
    file_blocks = raw.reshape(rows, blocks, size)
    kernel_blocks = blocks_by_row(out, SHAPES[kind][1])
    halves = np.ascontiguousarray(file_blocks[:, :, : 2 * fields]).view(np.float16)
    widened = np.ascontiguousarray(kernel_blocks[:, :, : 4 * fields]).view(np.float32)
    np.testing.assert_array_equal(widened, halves.astype(np.float32))  # NaNs compare equal
    np.testing.assert_array_equal(
        kernel_blocks[:, :, 4 * fields :], file_blocks[:, :, 2 * fields :]
    )


def test_every_float16_scale_widens_to_numpys_float32() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)  # subnormals, -0, infinities, NaNs
    raw = np.zeros((1 << 16, FILE_SHAPES[KINDS["Q8_0"]][1]), np.uint8)
    raw[:, :2] = bits.view(np.uint8).reshape(-1, 2)
    out = repack_blocks(raw, KINDS["Q8_0"])
    expected = bits.view(np.float16).astype(np.float32).view(np.uint32)
    widened = np.ascontiguousarray(blocks_by_row(out, 36)[:, 0, :4]).view(np.uint32)[:, 0]
    np.testing.assert_array_equal(widened, expected)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_keep_the_files_bytes_unless_rows_are_grouped(name: str) -> None:
    size = FILE_SHAPES[KINDS[name]][1]
    raw = np.random.default_rng(0).integers(0, 256, (6, 2 * size), dtype=np.uint8)
    assert repack_blocks(raw, KINDS[name]) is raw
    four = raw[:4]
    grouped = repack_blocks(four, KINDS[name])
    assert not np.shares_memory(grouped, four)
    np.testing.assert_array_equal(blocks_by_row(grouped, size), four.reshape(4, 2, size))
    # block 1 of row 0 follows block 0 of rows 0-3: one stream for a tile of four rows
    np.testing.assert_array_equal(grouped.reshape(-1)[4 * size : 5 * size], four[0, size:])


def test_reordered_rows_are_grouped_in_their_new_order() -> None:
    kind, size = KINDS["Q8_0"], FILE_SHAPES[KINDS["Q8_0"]][1]
    raw = np.random.default_rng(1).integers(0, 256, (8, 3 * size), dtype=np.uint8)
    order = np.array([5, 2, 7, 0, 1, 6, 3, 4])
    moved = blocks_by_row(repack_blocks(raw, kind, order), SHAPES[kind][1])
    np.testing.assert_array_equal(moved, blocks_by_row(repack_blocks(raw[order], kind), 36))
    np.testing.assert_array_equal(moved[:, :, 4:], raw[order].reshape(8, 3, size)[:, :, 2:])
