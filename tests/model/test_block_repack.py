"""The kernels' layout of the 32-input block formats (model/block_repack.py): each float16
header field widened to float32 (NumPy's conversion as the oracle, every bit pattern
included), the rest of each block unchanged, rows interleaved in groups of four where their
count allows; Q6_K rows in any other count are left as the file's bytes; Q5_K super-blocks
become Q5_1 blocks of the same weights, Q4_K its own compact layout of them (``gguf``'s
dequantization)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.model.block_ir import FILE_SHAPES, KINDS, READ_AS, SHAPES
from pagedattn.model.block_repack import repack_blocks
from tests.model.random_blocks import blocks_by_row, random_blocks

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


def test_q6k_keeps_the_files_bytes_unless_rows_are_grouped() -> None:
    size = FILE_SHAPES[KINDS["Q6_K"]][1]
    raw = np.random.default_rng(0).integers(0, 256, (6, 2 * size), dtype=np.uint8)
    assert repack_blocks(raw, KINDS["Q6_K"]) is raw
    four = raw[:4]
    grouped = repack_blocks(four, KINDS["Q6_K"])
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


@pytest.mark.parametrize("rows", [3, 8])
def test_q4k_becomes_float32_scales_byte_sub_scales_and_q4_1_codes(rows: int) -> None:
    """Q4_K in the kernels' layout, undone by hand: per group of G rows (4 where the count
    allows, else 1) and 256-input super-block, the G rows' float32 d, then float32 dmin, the
    eight sub-blocks' 6-bit scales as bytes ([sub][row]), their minimums, then each
    sub-block's 16 code bytes per row ([sub][row]; byte j = input j's nibble | input 16 + j's
    << 4). ggml's formula ``(d * sc) * code - dmin * m`` on them: ``gguf``'s weights, bit for
    bit."""
    raw = random_blocks(Q.Q4_K, (rows, 512), np.random.default_rng(rows))
    out = repack_blocks(raw, KINDS["Q4_K"])
    assert out.shape == (rows, 2 * 152) and SHAPES[KINDS["Q4_K"]] == (256, 152)
    g = 4 if rows % 4 == 0 else 1
    supers = out.reshape(rows // g, 2, 152 * g)  # (groups, super-blocks, bytes)

    def floats(start: int) -> np.ndarray:  # (groups, super-blocks, 1 sub-block axis, G)
        return np.ascontiguousarray(supers[..., start : start + 4 * g]).view(np.float32)[
            :, :, None, :
        ]

    sc, m = (supers[..., at : at + 8 * g].reshape(rows // g, 2, 8, g) for at in (8 * g, 16 * g))
    packed = supers[..., 24 * g :].reshape(rows // g, 2, 8, g, 16).astype(np.int64)
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.float32)
    scale, offset = floats(0) * sc.astype(np.float32), floats(4 * g) * m.astype(np.float32)
    weights = scale[..., None] * codes - offset[..., None]  # (groups, supers, subs, G, 32)
    weights = weights.transpose(0, 3, 1, 2, 4).reshape(rows, 512)
    want = dequantize(raw, Q.Q4_K).reshape(rows, 512)
    np.testing.assert_array_equal(weights.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("rows", [3, 8])
def test_q5k_becomes_q5_1_blocks_of_the_same_weights(rows: int) -> None:
    """Each 32-input sub-block becomes a Q5_1 block of the kernels' layout (float32 d,
    float32 m, the 32 fifth bits, then byte j = input j's nibble | input 16 + j's << 4), read
    here by ggml's Q5_1 formula ``d * code + m``: ``gguf``'s weights, bit for bit."""
    qtype = Q.Q5_K
    raw = random_blocks(qtype, (rows, 512), np.random.default_rng(rows))
    kind = KINDS[qtype.name]
    read_as = READ_AS[kind]
    out = repack_blocks(raw, kind)
    wide = SHAPES[read_as][1]
    assert out.shape == (rows, 16 * wide)
    blocks = blocks_by_row(out, wide)  # (rows, 16, wide)
    d = np.ascontiguousarray(blocks[:, :, 0:4]).view(np.float32)
    m = np.ascontiguousarray(blocks[:, :, 4:8]).view(np.float32)
    packed = blocks[:, :, 12:].astype(np.int64)
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1)  # inputs 0-15, then 16-31
    qh = np.ascontiguousarray(blocks[:, :, 8:12]).view(np.uint32).astype(np.int64)
    codes = codes | (((qh >> np.arange(32)) & 1) << 4)
    weights = d * codes.astype(np.float32) + m
    want = dequantize(raw, qtype).reshape(rows, 16, 32)
    np.testing.assert_array_equal(weights.view(np.uint32), want.view(np.uint32))
