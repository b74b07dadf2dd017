"""Matmuls of GGUF block-quantized rows with int8-quantized activations (opt-in, not exact).

llama.cpp's CPU path (``ggml_vec_dot_q4_1_q8_1``, ``ggml_vec_dot_q8_0_q8_0``): each 32-input
block of an activation row is quantized to int8 with a float scale ``dx = max|x| / 127``; a
block's dot product is then ``d * dx * sum(code * xq) + offset * dx * sum(xq)`` (Q8_0: no
offset; Q4_0 / Q5_0: offset ``-8 d`` / ``-16 d`` on codes stored + 8 / + 16; Q5_0 / Q5_1 codes
carry their fifth bit; Q6_K, a scale per 16 inputs: ``d * dx * (sc0 * sum_lo + sc1 * sum_hi)``,
``sum`` over ``(code - 32) * xq``, as the other kinds per 32-input block of the activations,
not per 256 as ggml's ``q8_K``). The integer dot product is exact: four inputs at a time from
:func:`pagedattn.model.int8_ir.quads` (AVX2 ``vpmaddubsw`` + ``vpmaddwd``, or VNNI ``vpdpbusd``,
on ymm or zmm: whichever the target has, the same exact sums; at most 2 * 31 * 127 per byte
pair for 4- and 5-bit codes, 2 * 127 * 127 for Q8_0's, no saturation), then a block's
(:func:`pagedattn.model.int8_ir.block_sums`), converted once. A register tile holds four output
rows' codes side by side, one row per 128-bit lane, and meets each activation row's block
broadcast to every lane, so that the float work is one multiply-add per (output, activation
row) and block, 16 of them in one zmm for four rows of eight (Q6_K against one activation row
takes :mod:`pagedattn.model.int8_q6_k`' tile). Every (row, output) is
the same sequence of operations for any row count and any of these instruction sets: batch
invariance holds on this path too, and every x86 path gives the AVX2 path's bits.

These are the only kernels of the package that name host-specific instructions (x86 SIMD), so
they live apart from the exact float path (:mod:`pagedattn.model.block_dot`): this module is
imported only when int8 activations are asked for, and its intrinsics refuse, with a Python
error, to emit their code for a CPU without AVX2
(:func:`pagedattn.model.int8_ir.require_int8`), where LLVM would otherwise stop the process.
"""

from __future__ import annotations

import numba
import numpy as np

from pagedattn.model.block_dot import ROWS_PER_TASK, num_part_tasks, part_task
from pagedattn.model.block_ir import BLOCK, ROW_GROUP, SHAPES
from pagedattn.model.decode_dot import DECODE_TILE
from pagedattn.model.int8_ir import int8_path
from pagedattn.model.int8_q6_k import Q6_K, make_q6_k_rows_dot
from pagedattn.model.int8_quantize import HALF, quantize_activations_serial
from pagedattn.model.int8_row_tiles import ROWS, make_rows_dot
from pagedattn.model.int8_tiles import make_int8_dot

INT8_COLS = 2  # activation rows per int8 register tile (several rows: prefill, batches)
GROUP_COLS = 4  # and per sixteen-row tile of row groups (zmm), between WIDE_COLS and INT8_COLS


# tiles of WIDE_COLS activation rows first (prefill, batches): the fastest measured on zmm and
# on ymm alike (Zen 4, one core, a 512-row Q4_1 projection: 4 and 16 were slower on zmm, 2 and
# 4 slower on ymm); DECODE_TILE output rows x WIDE_COLS, x INT8_COLS activation rows, x 1, and
# 1 x 1
WIDE_COLS = 8
_int8_wide = make_int8_dot(DECODE_TILE, WIDE_COLS)
_int8_tile = make_int8_dot(DECODE_TILE, INT8_COLS)
_int8_col = make_int8_dot(DECODE_TILE, 1)
_int8_one = make_int8_dot(1, 1)
# on zmm, a task's sixteen output rows in one tile: by WIDE_COLS activation rows, transposed
# (int8_row_tiles); by GROUP_COLS, INT8_COLS or one, four row groups each loaded whole (the
# 32-input kinds)
HAS_ROW_TILE = int8_path() in ("zmm", "vnni-zmm") and ROWS_PER_TASK == ROWS
_int8_rows = make_rows_dot(WIDE_COLS)
_GROUP_KINDS = tuple(k for k in SHAPES if k != Q6_K)
_int8_rows_four = make_int8_dot(ROWS, GROUP_COLS, _GROUP_KINDS)
_int8_rows_two = make_int8_dot(ROWS, INT8_COLS, _GROUP_KINDS)
_int8_rows_col = make_int8_dot(ROWS, 1, _GROUP_KINDS)
# Q6_K against one activation row: a row's block per ymm (int8_q6_k)
_q6_k_four = make_q6_k_rows_dot(DECODE_TILE)
_q6_k_one = make_q6_k_rows_dot(1)


@numba.njit(cache=True, nogil=True, inline="always")
def _put(out, tile, t, col, n, rows, cols):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t + c, col + n + i] = tile[i * cols + c] for a tile of ``rows`` x ``cols``."""
    for i in range(rows):
        for c in range(cols):
            out[t + c, col + n + i] = tile[i * cols + c]


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_task(xq, xd, xsum, blocks, kind, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, col + n] from int8 activations for the ROWS_PER_TASK rows of ``task``, by
    WIDE_COLS, then (whole tasks on zmm) GROUP_COLS, then INT8_COLS, then single activation
    rows: on zmm a whole task's rows in one tile (a grouped matrix's), else tiles of
    DECODE_TILE rows (grouped), then the leftover output rows one by one (every row of a
    matrix not stored in groups)."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    num_rows = xq.shape[0]
    grouped = blocks.shape[0] % ROW_GROUP == 0  # the tiles of several rows read groups
    whole = HAS_ROW_TILE and grouped and n0 + ROWS_PER_TASK <= n1
    t = 0
    while t < num_rows:
        if t + WIDE_COLS <= num_rows:
            cols = WIDE_COLS
        elif whole and kind != Q6_K and t + GROUP_COLS <= num_rows:
            cols = GROUP_COLS
        else:
            # Q6_K's one-row tiles beat its four-row tile by two activation rows
            cols = INT8_COLS if t + INT8_COLS <= num_rows and kind != Q6_K else 1
        n = n0
        if whole and cols == WIDE_COLS:
            _put(out, _int8_rows(kind, blocks, n0, xq, xd, xsum, t), t, col, n0, ROWS, cols)
            n = n1
        elif whole and kind != Q6_K:
            if cols == GROUP_COLS:
                four = _int8_rows_four(kind, blocks, n0, xq, xd, xsum, t)
                _put(out, four, t, col, n0, ROWS, cols)
            elif cols == INT8_COLS:
                two = _int8_rows_two(kind, blocks, n0, xq, xd, xsum, t)
                _put(out, two, t, col, n0, ROWS, cols)
            else:
                _put(out, _int8_rows_col(kind, blocks, n0, xq, xd, xsum, t), t, col, n0, ROWS, 1)
            n = n1
        while grouped and n + DECODE_TILE <= n1:
            if cols == WIDE_COLS:
                _put(
                    out, _int8_wide(kind, blocks, n, xq, xd, xsum, t), t, col, n, DECODE_TILE, cols
                )
            elif cols == INT8_COLS:
                _put(
                    out, _int8_tile(kind, blocks, n, xq, xd, xsum, t), t, col, n, DECODE_TILE, cols
                )
            elif kind == Q6_K:
                _put(out, _q6_k_four(kind, blocks, n, xq, xd, xsum, t), t, col, n, DECODE_TILE, 1)
            else:
                _put(out, _int8_col(kind, blocks, n, xq, xd, xsum, t), t, col, n, DECODE_TILE, 1)
            n += DECODE_TILE
        while n < n1:
            for c in range(cols):
                if kind == Q6_K:
                    out[t + c, col + n] = _q6_k_one(kind, blocks, n, xq, xd, xsum, t + c)[0]
                else:
                    out[t + c, col + n] = _int8_one(kind, blocks, n, xq, xd, xsum, t + c)[0]
            n += 1
        t += cols


@numba.njit(parallel=True, cache=True, nogil=True)
def qmatmul_blocks_int8(
    xq: np.ndarray,
    xd: np.ndarray,
    xsum: np.ndarray,
    b0: np.ndarray,
    b1: np.ndarray,
    b2: np.ndarray,
    kinds: tuple[int, int, int],
    num_parts: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``out = (xd * xq) @ concat(b0, b1, b2)[:num_parts].T``, laid out as
    :func:`pagedattn.model.block_dot.qmatmul_blocks`: one launch over tasks of ROWS_PER_TASK
    output rows, tiles of DECODE_TILE output rows by WIDE_COLS or INT8_COLS rows of ``xq``
    (each block's codes unpacked once for them). xq (T, K) int8, xd (K / 32, T) float32 and
    xsum (K / 32, T) int32 from :func:`pagedattn.model.int8_quantize.quantize_activations`."""
    for task in numba.prange(num_part_tasks(b0, b1, b2, num_parts)):
        blocks, kind, local, col = part_task(task, b0, b1, b2, kinds)
        _int8_task(xq, xd, xsum, blocks, kind, local, out, col)


@numba.njit(cache=True, nogil=True)
def project_int8(x, b0, b1, b2, kinds, num_parts, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`qmatmul_blocks_int8` of ``x`` (T, K) float32 quantized on this thread (a decode
    step's rows, as :func:`pagedattn.model.quantized.qmatmul` does it)."""
    rows, k = x.shape
    xq = np.empty((rows, k), np.int8)
    xd = np.empty((k // BLOCK, rows), np.float32)
    xsum = np.empty((k // HALF, rows), np.int32)
    quantize_activations_serial(x, xq, xd, xsum)
    qmatmul_blocks_int8(xq, xd, xsum, b0, b1, b2, kinds, num_parts, out)
