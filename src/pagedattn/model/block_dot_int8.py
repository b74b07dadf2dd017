"""Matmuls of GGUF block-quantized rows with int8-quantized activations (opt-in, not exact).

llama.cpp's CPU path (``ggml_vec_dot_q4_1_q8_1``, ``ggml_vec_dot_q8_0_q8_0``): each 32-input
block of an activation row is quantized to int8 with a float scale ``dx = max|x| / 127``; a
block's dot product is then ``d * dx * sum(code * xq) + offset * dx * sum(xq)`` (Q8_0: no
offset; Q4_0 / Q5_0: offset ``-8 d`` / ``-16 d`` on codes stored + 8 / + 16; Q5_0 / Q5_1 codes
carry their fifth bit), the integer sums four inputs at a time from
:func:`pagedattn.model.int8_ir.quads` (AVX2 ``vpmaddubsw`` + ``vpmaddwd``, or VNNI ``vpdpbusd``,
on ymm or zmm: whichever the target has, the same exact sums; at most 2 * 31 * 127 per byte
pair for 4- and 5-bit codes, 2 * 127 * 127 for Q8_0's, no saturation). Every (row, output) is
the same sequence of operations for any row count and any of these instruction sets: batch
invariance holds on this path too, and every x86 path gives the AVX2 path's bits.

These are the only kernels of the package that name host-specific instructions (x86 SIMD), so
they live apart from the exact float path (:mod:`pagedattn.model.block_dot`): this module is
imported only when int8 activations are asked for, and its intrinsics refuse, with a Python
error, to emit their code for a CPU without AVX2 (:func:`require_int8`), where LLVM would
otherwise stop the process.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pagedattn.kernels.simd_ir import F32, I32, Arr2D, carried_loop, fma, hsum, prefetch, splat
from pagedattn.kernels.target import has_avx2, target_cpu
from pagedattn.model.block_dot import DECODE_TILE, ROWS_PER_TASK, num_part_tasks, part_task
from pagedattn.model.block_ir import BLOCK, INT8_KINDS, LAYOUT, block_ptr, by_kind, scale_offset
from pagedattn.model.int8_ir import (
    PAIR_BYTES,
    PAIR_LANES,
    V8F,
    V16F,
    V32I8,
    abs_bytes,
    block_codes,
    int8_path,
    quads,
    scale_pair,
    signed_like,
    xq_twice,
)
from pagedattn.model.int8_quantize import quantize_activations_serial

INT8_COLS = 2  # activation rows per int8 register tile (several rows: prefill, batches)


def int8_unsupported() -> str | None:
    """Why int8 activations cannot run on the CPU Numba compiles for (one line), or None."""
    if has_avx2():
        return None
    return f"activations: int8 needs a CPU with AVX2, and {target_cpu()[0]} has none; use float32"


def require_int8() -> None:
    """Raise ValueError (:func:`int8_unsupported`'s line) unless the target has AVX2."""
    reason = int8_unsupported()
    if reason is not None:
        raise ValueError(reason)


def _make_int8_dot(rows: int, cols: int) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xs, t0) -> UniTuple(float32, rows * cols): at index
    ``r * cols + c``, out[t0 + c, n0 + r] from int8 activations ``xq`` (T, K), block scales
    ``xd`` and sums ``xs`` (T, K / 32); Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 (ggml's
    ``ggml_vec_dot_q8_0_q8_0``: signed codes, so the unsigned operand is ``|xq|`` and the
    codes take ``xq``'s sign; a product pair is at most 2 * 127 * 127, below int16's limit,
    as ``|xq| <= 127``). A block's codes are unpacked once for the ``cols`` activation rows.
    Per (output, row) and block, :func:`pagedattn.model.int8_ir.quads` gives eight int32 sums
    and ``acc = fma(d * dx, float(sums), acc)`` takes them into eight float lanes, summed by
    halving at the end, plus the offset term ``fma(offset, xs, off)`` (the tile's output rows
    side by side in one vector per activation row): the same operations whatever ``rows``,
    ``cols`` and instruction set (on zmm, two output rows share a register, each lane still its
    own row's sequence)."""
    tile = rows * cols

    @intrinsic  # type: ignore[misc]
    def int8_dot(
        typingctx: Any,
        kind: Any,
        blocks: Any,
        n0: Any,
        xq: Any,
        xd: Any,
        xs: Any,
        t0: Any,
    ) -> Any:
        sig = types.UniTuple(types.float32, tile)(kind, blocks, n0, xq, xd, xs, t0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            require_int8()  # never emit the x86 intrinsics for a CPU without them
            b_arr, q_arr, d_arr, x_arr = (
                Arr2D(context, builder, sig.args[i], args[i]) for i in (1, 3, 4, 5)
            )
            n_first, t_first = args[2], args[6]
            i64 = n_first.type
            wide = rows % 2 == 0 and int8_path() in ("zmm", "vnni-zmm")
            groups = rows // 2 if wide else rows  # float accumulators per activation row
            zero = ir.Constant(V16F if wide else V8F, [0.0] * (16 if wide else 8))

            # the offset terms: one <rows x float> per activation row (lane r: output row r)
            row_lanes = ir.VectorType(F32, rows)
            off_zero = ir.Constant(row_lanes, [0.0] * rows)

            def emit(kind: int) -> list[ir.Value]:
                size, header, _ = LAYOUT[kind]
                accs = [zero] * (groups * cols) + [off_zero] * cols

                def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                    k = builder.mul(b, i64(BLOCK))
                    xqv, unsigned, dx, sx = [], [], [], []
                    for c in range(cols):
                        t_row = builder.add(t_first, i64(c))
                        q_ptr = builder.bitcast(q_arr.ptr(builder, t_row, k), V32I8.as_pointer())
                        xqv.append(builder.load(q_ptr, align=1))
                        if wide:
                            xqv[c] = xq_twice(builder, xqv[c])
                        # |xq| (vpabsb, once per block for every row): Q8_0's unsigned operand
                        unsigned.append(abs_bytes(builder, xqv[c]) if kind == 2 else None)
                        dx.append(builder.load(d_arr.ptr(builder, t_row, b)))
                        sx.append(builder.load(x_arr.ptr(builder, t_row, b)))
                    codes, scales, offsets = [], [], []
                    for r in range(rows):
                        n = builder.add(n_first, i64(r))
                        block = block_ptr(builder, b_arr, n, b, size)
                        prefetch(
                            builder,
                            block_ptr(builder, b_arr, builder.add(n, i64(2 * rows)), b, size),
                        )
                        codes.append(block_codes(builder, kind, builder.gep(block, [i64(header)])))
                        d, m = scale_offset(builder, kind, block)
                        scales.append(d)
                        offsets.append(m)
                    vec, off = list(accs[: groups * cols]), list(accs[groups * cols :])
                    for g in range(groups):
                        if wide:
                            operand = builder.shuffle_vector(
                                codes[2 * g], codes[2 * g + 1], PAIR_BYTES
                            )
                            d_pair = scale_pair(builder, scales[2 * g], scales[2 * g + 1])
                        else:
                            operand = codes[g]
                        for c in range(cols):
                            if kind == 2:
                                signed = signed_like(builder, operand, xqv[c])
                                sums = quads(builder, unsigned[c], signed)
                            else:
                                sums = quads(builder, operand, xqv[c])
                            if wide:
                                ddx = builder.fmul(d_pair, splat(builder, dx[c], 16))
                            else:
                                ddx = splat(builder, builder.fmul(scales[g], dx[c]), 8)
                            i = g * cols + c
                            vec[i] = fma(builder, ddx, builder.sitofp(sums, zero.type), vec[i])
                    if kind != 2:  # Q8_0 has no offset
                        by_row = ir.Constant(row_lanes, ir.Undefined)
                        for r, m in enumerate(offsets):
                            by_row = builder.insert_element(by_row, m, I32(r))
                        for c in range(cols):
                            off[c] = fma(builder, by_row, splat(builder, sx[c], rows), off[c])
                    return vec + off

                carried_loop(builder, builder.sdiv(b_arr.shape[1], i64(size)), accs, body)
                lanes = []  # each (output row, activation row)'s eight float lanes
                for r in range(rows):
                    for c in range(cols):
                        if wide:
                            v = accs[(r // 2) * cols + c]
                            lanes.append(builder.shuffle_vector(v, v, PAIR_LANES[r % 2]))
                        else:
                            lanes.append(accs[r * cols + c])
                return [
                    builder.fadd(
                        hsum(builder, lanes[r * cols + c]),
                        builder.extract_element(accs[groups * cols + c], I32(r)),
                    )
                    for r in range(rows)
                    for c in range(cols)
                ]

            sums = by_kind(builder, args[0], emit, INT8_KINDS)
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    return int8_dot


# on zmm (32 registers, two output rows each), tiles of WIDE_COLS activation rows first
WIDE_COLS = 4 if int8_path() in ("zmm", "vnni-zmm") else INT8_COLS
HAS_WIDE = WIDE_COLS > INT8_COLS  # a constant: LLVM drops the wide branch where it is False
# DECODE_TILE output rows x WIDE_COLS, x INT8_COLS activation rows, x 1, and 1 x 1
_int8_wide = _make_int8_dot(DECODE_TILE, WIDE_COLS)
_int8_tile = _make_int8_dot(DECODE_TILE, INT8_COLS)
_int8_col = _make_int8_dot(DECODE_TILE, 1)
_int8_one = _make_int8_dot(1, 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_task(xq, xd, xs, blocks, kind, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, col + n] from int8 activations for the ROWS_PER_TASK rows of ``task``: tiles of
    DECODE_TILE output rows by WIDE_COLS, then INT8_COLS, then single activation rows, then the
    leftover output rows one by one."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    num_rows = xq.shape[0]
    t = 0
    while t < num_rows:
        if HAS_WIDE and t + WIDE_COLS <= num_rows:
            cols = WIDE_COLS
        else:
            cols = INT8_COLS if t + INT8_COLS <= num_rows else 1
        n = n0
        while n + DECODE_TILE <= n1:
            if HAS_WIDE and cols == WIDE_COLS:
                rw = _int8_wide(kind, blocks, n, xq, xd, xs, t)
                for i in range(DECODE_TILE):
                    for c in range(WIDE_COLS):
                        out[t + c, col + n + i] = rw[i * WIDE_COLS + c]
            elif cols == INT8_COLS:
                r = _int8_tile(kind, blocks, n, xq, xd, xs, t)
                for i in range(DECODE_TILE):
                    for c in range(INT8_COLS):
                        out[t + c, col + n + i] = r[i * INT8_COLS + c]
            else:
                r1 = _int8_col(kind, blocks, n, xq, xd, xs, t)
                for i in range(DECODE_TILE):
                    out[t, col + n + i] = r1[i]
            n += DECODE_TILE
        while n < n1:
            for c in range(cols):
                out[t + c, col + n] = _int8_one(kind, blocks, n, xq, xd, xs, t + c)[0]
            n += 1
        t += cols


@numba.njit(parallel=True, cache=True, nogil=True)
def qmatmul_blocks_int8(
    xq: np.ndarray,
    xd: np.ndarray,
    xs: np.ndarray,
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
    (each block's codes unpacked once for them). xq (T, K) int8, xd / xs (T, K / 32) float32
    from :func:`pagedattn.model.int8_quantize.quantize_activations`."""
    for task in numba.prange(num_part_tasks(b0, b1, b2, num_parts)):
        blocks, kind, local, col = part_task(task, b0, b1, b2, kinds)
        _int8_task(xq, xd, xs, blocks, kind, local, out, col)


@numba.njit(cache=True, nogil=True)
def project_int8(x, b0, b1, b2, kinds, num_parts, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`qmatmul_blocks_int8` of ``x`` (T, K) float32 quantized on this thread (a decode
    step's rows, as :func:`pagedattn.model.quantized.qmatmul` does it)."""
    rows, k = x.shape
    xq = np.empty((rows, k), np.int8)
    xd = np.empty((rows, k // BLOCK), np.float32)
    xs = np.empty((rows, k // BLOCK), np.float32)
    quantize_activations_serial(x, xq, xd, xs)
    qmatmul_blocks_int8(xq, xd, xs, b0, b1, b2, kinds, num_parts, out)
