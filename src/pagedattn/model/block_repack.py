"""GGUF blocks as the matmul kernels read them: the 32-input formats' float16 header fields
widened to float32 at load, and every format's rows interleaved by groups of four.

A Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 block (ggml ``ggml-common.h``) starts with a float16
scale (and Q4_1's / Q5_1's float16 minimum). Read from the file's bytes, every block cost the
kernels a 16-bit load, a conversion and a broadcast per field before its first multiply-add:
on a 135M model's decode step, six of the fifteen instructions of a Q4_1 block against one
activation row. Widened once at load (an exact conversion), the field is a float32 the kernel
broadcasts straight from memory, or folds into a multiply-add's operand. This is the layout
llama.cpp's repacked CPU formats (``block_q4_0x8``) take for the same reason: one made for the
kernel, built once. Every format's rows are interleaved by groups of four where the row count
allows (:func:`~pagedattn.model.block_ir.block_ptr`), so that a tile of four rows is one stream.

A Q5_K super-block (``block_q5_K``) becomes eight Q5_1 blocks of the kernels' layout
(:data:`~.block_ir.READ_AS`), one per 32-input sub-block: float32 ``d * sc`` and ``-(dmin *
m)`` (``get_scale_min_k4``'s 6-bit scale and minimum; both products exact), then the
sub-block's high bits and codes in Q5_1's order. ``dequantize_row_q5_K`` computes ``(d * sc) *
q - dmin * m``, and the Q5_1 kernels ``fma(d * sc, q, -(dmin * m))``: the product is exact, so
both round once, the same weight.

Q4_K, the type most of a Q4_K_M file is, keeps its super-blocks in a layout of its own
(:data:`~.q4_k.Q4_K_FIELDS`, 19 bytes per 32 inputs): float32 ``d`` and ``dmin``, the
eight 6-bit scales and minimums unpacked to bytes, then each sub-block's codes in Q4_1's
order; in a group of four rows each field's values lie side by side, so the kernels read a
group's scales of a super-block as a few vectors and compute ``d * sc`` and ``-(dmin * m)``
there, the same values. Eight Q4_1 blocks (24 bytes per 32 inputs, as Q5_K's) cost a quarter
more bytes, which decode from memory pays for: on Qwen2.5-1.5B's Q4_K matrices, one thread,
int8 activations 35 against 31 ms, the exact path the same 60 ms.

The layout of a widened block: the float32 fields where the float16 ones were, then the rest
of the block's bytes unchanged (Q5's high bits, the codes). Sizes: :data:`~.block_ir.SHAPES`
(the kernels') against :data:`~.block_ir.FILE_SHAPES` (the file's).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from pagedattn.kernels.numba_runtime import install as install_numba_runtime
from pagedattn.model.block_ir import (
    FILE_SHAPES,
    LAYOUT,
    Q4_K,
    READ_AS,
    ROW_GROUP,
    SHAPES,
    WIDENED_FIELDS,
    interleaved,
)
from pagedattn.model.mapped_pages import release_pages
from pagedattn.model.q4_k import Q4_K_FIELDS

# The loader runs this module's kernel first of all: Numba's runtime must be the cached one
# by then (kernels/numba_runtime.py; compiling it touched ~22 MiB more of LLVM and its heap).
install_numba_runtime()

CHUNK_BYTES = 4 << 20  # rows repacked between two hand-backs of the file's pages


@functools.cache
def _half_table() -> np.ndarray:
    """float32 bits of every float16 bit pattern (an exact conversion, NaNs kept as NaNs)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


@numba.njit(cache=True, nogil=True)
def _repack_rows(raw16, rows, r0, r1, out16, out32, table, size, wide, fields, group):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Output rows ``r0 .. r1`` (``r0`` a multiple of ``group``): row ``i`` is row ``rows[i]``
    of the input, each block with its ``fields`` float16 at its start widened to float32 (by
    ``table``), then its other bytes copied (all block sizes and fields are whole 16-bit
    words), and placed as the kernels read it: block ``b`` of row ``i`` in slot
    ``b * group + i % group`` of its group of ``group`` rows. ``raw16`` is the file's rows as
    uint16, ``out16`` / ``out32`` the whole output as flat uint16 / uint32."""
    num_blocks = raw16.shape[1] * 2 // size
    src_words, dst_words, rest = size // 2, wide // 2, (size - 2 * fields) // 2
    row_words = num_blocks * dst_words
    for i in range(r0, r1):
        src_row = raw16[rows[i]]
        within = i % group
        first = (i - within) * row_words + within * dst_words
        for b in range(num_blocks):
            src, dst = b * src_words, first + b * group * dst_words
            for f in range(fields):
                out32[dst // 2 + f] = table[src_row[src + f]]
            codes_src = src_row[src + fields : src + src_words]
            codes_dst = out16[dst + 2 * fields :]
            for j in range(rest):
                codes_dst[j] = codes_src[j]


@numba.njit(cache=True, nogil=True)
def _scale_min(scales, j):  # type: ignore[no-untyped-def]  # pragma: no cover
    """ggml's ``get_scale_min_k4``: sub-block ``j``'s 6-bit scale and minimum."""
    if j < 4:
        return scales[j] & 63, scales[j + 4] & 63
    sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4)
    return sc, (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)


@numba.njit(cache=True, nogil=True)
def _sub_blocks(raw, rows, r0, r1, out8, out32, halves, kind, group, size, wide, header):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Output rows ``r0 .. r1`` of Q4_K (kind 5) or Q5_K (6) ``raw`` rows (super-blocks of
    ``size`` bytes) as Q4_1 / Q5_1 blocks of the kernels' layout (module docstring: ``wide``
    bytes, the codes ``header`` bytes in), placed as :func:`_repack_rows` places blocks;
    ``out8`` / ``out32`` the whole output as flat uint8 / uint32, ``halves`` the float32 of
    every float16 bit pattern."""
    codes = 16 if kind == 5 else 48  # block_q4_K: d, dmin, scales[12]; block_q5_K: + qh[32]
    out_f = out32.view(np.float32)
    num_super = raw.shape[1] // size
    row_blocks = num_super * 8
    for i in range(r0, r1):
        src = raw[rows[i]]
        within = i % group
        first = (i - within) * row_blocks + within
        for sb in range(num_super):
            block = src[sb * size : (sb + 1) * size]
            d = halves[np.int64(block[0]) | (np.int64(block[1]) << 8)]
            dmin = halves[np.int64(block[2]) | (np.int64(block[3]) << 8)]
            for j in range(8):
                sc, m = _scale_min(block[4:16], j)
                at = (first + (sb * 8 + j) * group) * wide
                out_f[at // 4] = d * np.float32(sc)
                out_f[at // 4 + 1] = -(dmin * np.float32(m))
                if kind == 6:  # bit j of qh[l]: the fifth bit of the sub-block's input l
                    bits = np.uint32(0)
                    for lane in range(32):
                        bits |= np.uint32((block[16 + lane] >> j) & 1) << np.uint32(lane)
                    out32[at // 4 + 2] = bits
                # sub-block j: the low (j even) or high nibbles of the 32 bytes of its pair
                q = block[codes + 32 * (j // 2) : codes + 32 * (j // 2) + 32]
                shift = 4 * (j % 2)
                for lane in range(16):
                    low, high = (q[lane] >> shift) & 15, (q[lane + 16] >> shift) & 15
                    out8[at + header + lane] = low | (high << 4)


# Q4_K's bytes per super-block in the file and in the kernels' layout, and the layout's field
# offsets (Q4_K_FIELDS: d, dmin, sc, m, codes), as plain ints for the compiled repack
_Q4_K_SIZES = (FILE_SHAPES[Q4_K][1], SHAPES[Q4_K][1])
_Q4_K_OFFSETS = tuple(Q4_K_FIELDS[f][0] for f in ("d", "dmin", "sc", "m", "codes"))


@numba.njit(cache=True, nogil=True)
def _q4_k_rows(raw, rows, r0, r1, out8, halves, group):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Output rows ``r0 .. r1`` of Q4_K ``raw`` rows in the kernels' layout
    (:data:`~.q4_k.Q4_K_FIELDS`, :func:`~.q4_k.q4_k_at`): per group of ``group`` rows
    and super-block, each field's elements side by side; ``out8`` the whole output as flat
    uint8, ``halves`` the float32 of every float16 bit pattern."""
    size, wide = _Q4_K_SIZES
    d_at, dmin_at, sc_at, m_at, codes_at = _Q4_K_OFFSETS
    num_super = raw.shape[1] // size
    out_f = out8.view(np.float32)
    for i in range(r0, r1):
        src = raw[rows[i]]
        within = i % group
        for sb in range(num_super):
            block = src[sb * size : (sb + 1) * size]
            base = (i - within) * num_super * wide + sb * wide * group
            d = halves[np.int64(block[0]) | (np.int64(block[1]) << 8)]
            out_f[(base + d_at * group + 4 * within) // 4] = d
            dmin = halves[np.int64(block[2]) | (np.int64(block[3]) << 8)]
            out_f[(base + dmin_at * group + 4 * within) // 4] = dmin
            for j in range(8):
                sc, m = _scale_min(block[4:16], j)
                out8[base + sc_at * group + j * group + within] = sc
                out8[base + m_at * group + j * group + within] = m
                # sub-block j: the low (j even) or high nibbles of the 32 bytes of its pair
                q = block[16 + 32 * (j // 2) : 16 + 32 * (j // 2) + 32]
                shift = 4 * (j % 2)
                at = base + codes_at * group + (j * group + within) * 16
                for lane in range(16):
                    low, high = (q[lane] >> shift) & 15, (q[lane + 16] >> shift) & 15
                    out8[at + lane] = low | (high << 4)


def repack_blocks(raw: np.ndarray, kind: int, rows: np.ndarray | None = None) -> np.ndarray:
    """The kernels' layout of ``raw`` (rows of the file's ``kind`` blocks, C-contiguous uint8
    (n, bytes per row)): a new array with each block's float16 header fields widened to
    float32 (a Q5_K super-block as eight blocks of ``READ_AS[kind]``, a Q4_K one in its compact
    layout, :mod:`~pagedattn.model.q4_k`) and, where the row
    count is a multiple of :data:`~.block_ir.ROW_GROUP`, the rows interleaved by groups
    (:func:`~.block_ir.block_ptr`); ``raw`` itself for Q6_K in a row count that is not a
    multiple of four, ``rows`` None.

    rows: the output's rows as indices into ``raw`` (to undo llama.cpp's q/k permutation, or
    one part of a fused tensor), in one copy; None: every row in order.

    The conversion is exact (every float16 is a float32), so every weight the kernels decode
    is the value ``gguf.quants.dequantize`` gives, bit for bit."""
    fields = WIDENED_FIELDS.get(kind, 0)
    order = np.arange(raw.shape[0]) if rows is None else np.asarray(rows, np.int64)
    n = order.shape[0]
    group = ROW_GROUP if interleaved(n) else 1
    if not fields and kind not in READ_AS and kind != Q4_K and group == 1:
        return raw if rows is None else np.ascontiguousarray(raw[order])
    size, (inputs, wide) = FILE_SHAPES[kind][1], SHAPES[READ_AS.get(kind, kind)]
    table = _half_table()
    halves = table.view(np.float32)
    out = np.empty((n, raw.shape[1] // size * FILE_SHAPES[kind][0] // inputs * wide), np.uint8)
    flat = out.reshape(-1)
    raw16, out16, out32 = raw.view(np.uint16), flat.view(np.uint16), flat.view(np.uint32)
    # a chunk of rows at a time; in file order, the file's pages of each chunk are handed
    # back once copied (for a view of a mapped file; nothing otherwise), so that a matrix's
    # load never holds both whole copies
    step = max(group, CHUNK_BYTES // max(1, raw.shape[1]) // group * group)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        if kind == Q4_K:
            _q4_k_rows(raw, order, r0, r1, flat, halves, group)
        elif kind in READ_AS:
            header = LAYOUT[READ_AS[kind]][1]
            _sub_blocks(raw, order, r0, r1, flat, out32, halves, kind, group, size, wide, header)
        else:
            _repack_rows(raw16, order, r0, r1, out16, out32, table, size, wide, fields, group)
        if rows is None:
            release_pages(raw[r0:r1])
    return out
