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

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir

from pagedattn.kernels.simd_ir import (
    F32,
    I8,
    I32,
    Arr2D,
    carried_loop,
    fma,
    mask,
)
from pagedattn.model.block_dot import DECODE_TILE, ROWS_PER_TASK, num_part_tasks, part_task
from pagedattn.model.block_ir import BLOCK, ROW_GROUP, SHAPES
from pagedattn.model.int8_blocks import (
    Blocks,
    Groups,
    TileOperands,
    block_offsets,
    int8_tile,
    row_floats,
    sub_blocks,
    super_block,
    tile_blocks,
    tile_codes,
)
from pagedattn.model.int8_ir import (
    GROUPS,
    biased_q8,
    block_sums,
    int8_path,
    operands,
    quads,
    repeated,
)
from pagedattn.model.int8_q6_k import (
    Q6_K,
    make_q6_k_rows_dot,
    minus_32,
    q6_k_codes,
    q6_k_scales,
    q6_k_sub_scales,
    q6_k_total,
)
from pagedattn.model.int8_quantize import HALF, quantize_activations_serial
from pagedattn.model.int8_row_tiles import ROWS, make_rows_dot

INT8_COLS = 2  # activation rows per int8 register tile (several rows: prefill, batches)


def _make_int8_dot(rows: int, cols: int, kinds: tuple[int, ...] = tuple(SHAPES)) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, rows * cols): at index
    ``r * cols + c``, out[t0 + c, n0 + r] from int8 activations ``xq`` (T, K), block scales
    ``xd`` (K / 32, T) and the integer sums ``xsum`` of each block's 16-input halves (K / 16,
    T; both block-major); Q4_0 = 0, Q4_1 = 1, Q8_0 = 2
    (ggml's ``ggml_vec_dot_q8_0_q8_0``: signed codes; with VNNI they meet ``xq`` as the
    unsigned ``code + 128`` and ``128 * xsum`` is taken off the integer sum, without it as
    ``|xq|`` times the codes with ``xq``'s sign, a product pair at most 2 * 127 * 127, below
    int16's limit), Q5_0 = 3, Q5_1 = 4, Q6_K = 7 (a 32-input sub-block of its super-block per
    step; each half's sum met by its int8 scale first, :mod:`pagedattn.model.int8_blocks`). A
    block's codes are unpacked once for the ``cols`` activation rows
    (:func:`pagedattn.model.int8_blocks.tile_codes`). Per (output,
    activation row) and block, as ggml's reference ``ggml_vec_dot_q4_1_q8_1``: ``acc =
    fma(d * dx, float(sum), acc)`` with ``sum`` the block's exact integer dot product, and
    ``off = fma(offset, xs, off)`` with ``xs = dx * float(xsum)`` (q8_1's ``s``); the result
    is ``acc + off`` (Q6_K: no offset term); the same operations whatever ``rows``, ``cols``
    and instruction set."""
    assert rows in (1, ROW_GROUP, ROWS)
    tile = rows * cols
    lanes = GROUPS * rows

    def emitter(builder: ir.IRBuilder, ops: TileOperands) -> Callable[[int], list[ir.Value]]:
        b_arr, q_arr, d_arr, x_arr, n_first, t_first = ops
        i64 = n_first.type
        tile_ty = ir.VectorType(F32, tile)
        sum_ty = ir.VectorType(I32, lanes)
        v16 = ir.VectorType(I8, 16).as_pointer()
        # a tile's sums: lane r * cols + c for output row r and activation row c
        by_row = mask([r for r in range(rows) for _ in range(cols)])
        by_col = mask([c for _ in range(rows) for c in range(cols)])

        def per_col(b: ir.Value, arr: Arr2D, element: ir.Type) -> ir.Value:
            """<cols x element>: arr[b, t0 .. t0 + cols - 1] (block-major, one load)."""
            ptr = arr.ptr(builder, b, t_first)
            at = builder.bitcast(ptr, ir.VectorType(element, cols).as_pointer())
            return builder.load(at, align=4)

        def by_cols(values: ir.Value) -> ir.Value:
            """<tile x ...>: lane r * cols + c of ``values``' element c."""
            return builder.shuffle_vector(values, values, by_col)

        def by_rows(values: ir.Value) -> ir.Value:
            """<tile x ...>: lane r * cols + c of ``values``' element r."""
            return builder.shuffle_vector(values, values, by_row)

        def emit(kind: int) -> list[ir.Value]:
            size = SHAPES[kind][1]
            subs = sub_blocks(kind)  # Q6_K: eight 32-input blocks per super-block
            zero = ir.Constant(tile_ty, [0.0] * tile)

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                k = builder.mul(b, i64(BLOCK))
                sb, sub = (b, None) if subs == 1 else super_block(builder, b, subs)
                # prefetched: the same block of the rows two tiles further (at least eight)
                pointers = tile_blocks(
                    builder, b_arr, n_first, sb, size, rows, max(8, 2 * rows), sub, subs
                )
                blocks: Blocks = pointers
                if sub is None:
                    if rows > 1:  # each group's blocks: one load, fields picked in registers
                        blocks = Groups.load(builder, pointers[::ROW_GROUP], size)
                    lo, hi = tile_codes(builder, kind, blocks)
                else:  # Q6_K
                    lo, hi = q6_k_codes(builder, pointers, sub)
                biased = biased_q8(kind, lo.type.count)
                split = sub is not None  # Q6_K, a scale per 16 inputs: the halves' sums apart
                halves: tuple[list[ir.Value], list[ir.Value]] = ([], [])
                for c in range(cols):
                    t_row = builder.add(t_first, i64(c))
                    sums = ir.Constant(sum_ty, [0] * lanes)
                    for half, (codes, at) in enumerate(((lo, k), (hi, builder.add(k, i64(16))))):
                        x_ptr = builder.bitcast(q_arr.ptr(builder, t_row, at), v16)
                        x = repeated(builder, builder.load(x_ptr, align=1), rows)
                        sums = quads(builder, *operands(builder, kind, biased, codes, x), sums)
                        if split or half == 1:
                            halves[half if split else 0].append(sums)
                            sums = ir.Constant(sum_ty, [0] * lanes)
                # <cols x i32>: the integer sums of the block's two halves of activations
                x_halves = [
                    per_col(builder.add(builder.mul(b, i64(2)), i64(h)), x_arr, I32)
                    for h in range(2)
                ]
                dx = per_col(b, d_arr, F32)
                if sub is not None:
                    centred = [  # each half's sum of (code - 32) * xq (minus_32)
                        builder.add(block_sums(builder, h), by_cols(minus_32(builder, x)))
                        for h, x in zip(halves, x_halves, strict=True)
                    ]
                    scales = q6_k_sub_scales(builder, pointers, sub)
                    block_total = q6_k_total(
                        builder, (by_rows(scales[0]), by_rows(scales[1])), (centred[0], centred[1])
                    )
                    d = by_rows(q6_k_scales(builder, pointers))
                    total = builder.sitofp(block_total, tile_ty)
                    return [fma(builder, builder.fmul(d, by_cols(dx)), total, accs[0]), accs[1]]
                block_total = block_sums(builder, halves[0])
                x_sums = builder.add(*x_halves)
                if biased:
                    bias = builder.shl(by_cols(x_sums), ir.Constant(block_total.type, [7] * tile))
                    block_total = builder.sub(block_total, bias)
                total = builder.sitofp(block_total, tile_ty)
                d_rows = row_floats(builder, blocks, 0)
                d = by_rows(d_rows)
                acc = fma(builder, builder.fmul(d, by_cols(dx)), total, accs[0])
                offsets = block_offsets(builder, kind, blocks, d_rows)
                if offsets is None:
                    return [acc, accs[1]]
                xs = builder.fmul(dx, builder.sitofp(x_sums, dx.type))  # q8_1's s
                return [acc, fma(builder, by_rows(offsets), by_cols(xs), accs[1])]

            accs = [zero, zero]
            count = builder.mul(builder.sdiv(b_arr.shape[1], i64(size)), i64(subs))
            carried_loop(builder, count, accs, body)
            result = builder.fadd(accs[0], accs[1])
            return [builder.extract_element(result, I32(i)) for i in range(tile)]

        return emit

    return int8_tile(tile, emitter, kinds)


# tiles of WIDE_COLS activation rows first (prefill, batches): the fastest measured on zmm and
# on ymm alike (Zen 4, one core, a 512-row Q4_1 projection: 4 and 16 were slower on zmm, 2 and
# 4 slower on ymm); DECODE_TILE output rows x WIDE_COLS, x INT8_COLS activation rows, x 1, and
# 1 x 1
WIDE_COLS = 8
_int8_wide = _make_int8_dot(DECODE_TILE, WIDE_COLS)
_int8_tile = _make_int8_dot(DECODE_TILE, INT8_COLS)
_int8_col = _make_int8_dot(DECODE_TILE, 1)
_int8_one = _make_int8_dot(1, 1)
# on zmm, a task's sixteen output rows in one tile: by WIDE_COLS activation rows, transposed
# (int8_row_tiles); by INT8_COLS or one, four groups each loaded whole (the 32-input kinds)
HAS_ROW_TILE = int8_path() in ("zmm", "vnni-zmm") and ROWS_PER_TASK == ROWS
_int8_rows = make_rows_dot(WIDE_COLS)
_GROUP_KINDS = tuple(k for k in SHAPES if k != Q6_K)
_int8_rows_two = _make_int8_dot(ROWS, INT8_COLS, _GROUP_KINDS)
_int8_rows_col = _make_int8_dot(ROWS, 1, _GROUP_KINDS)
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
    WIDE_COLS, then INT8_COLS, then single activation rows: on zmm a whole task's rows in one
    tile (a grouped matrix's), else tiles of DECODE_TILE rows (grouped), then the leftover
    output rows one by one (every row of a matrix not stored in groups)."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    num_rows = xq.shape[0]
    grouped = blocks.shape[0] % ROW_GROUP == 0  # the tiles of several rows read groups
    whole = HAS_ROW_TILE and grouped and n0 + ROWS_PER_TASK <= n1
    t = 0
    while t < num_rows:
        if t + WIDE_COLS <= num_rows:
            cols = WIDE_COLS
        else:
            # Q6_K's one-row tiles beat its four-row tile by two activation rows
            cols = INT8_COLS if t + INT8_COLS <= num_rows and kind != Q6_K else 1
        n = n0
        if whole and cols == WIDE_COLS:
            _put(out, _int8_rows(kind, blocks, n0, xq, xd, xsum, t), t, col, n0, ROWS, cols)
            n = n1
        elif whole and kind != Q6_K:
            if cols == INT8_COLS:
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
