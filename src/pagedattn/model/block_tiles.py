"""The scratch-tile matmuls: a task's weight rows decoded once into a float32 scratch, then met
by every activation row in register tiles (prefill and batched steps), and the same tiles over
float32 weights.

Each output takes the operation order :mod:`pagedattn.model.block_dot` defines (16 lane
accumulators, in-order fused multiply-adds, a halving sum), so :func:`qmatmul_tiled` equals
:func:`~pagedattn.model.block_dot.qmatmul_blocks` bit for bit and :func:`matmul_float` keeps
float checkpoints batch-invariant too.

Both operands start on a cache line (:data:`ALIGN`): a vector load that straddles two lines
costs two, and the tiles issue one load per two multiply-adds, so a 16- or 32-byte aligned
operand (NumPy's and Numba's allocations) made the tiles 25-40 % slower than aligned ones.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pagedattn.kernels.simd_ir import Arr2D, carried_loop, fma, hsum, load_vector
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.block_decoders import GROUP, decoder
from pagedattn.model.block_dot import ROWS_PER_TASK
from pagedattn.model.block_ir import LANES, SHAPES, VF, by_kind

# output rows x activation rows per register tile: 2 x 3 accumulators, two ymm each, with the
# rows of x and a weight vector fill AVX2's 16 registers; AVX-512's 32 zmm hold 4 x 4 (with 4
# rows of x and a weight vector: 21), twice the multiply-adds per vector loaded. Each output's
# order of operations is the same in every tile shape: the same bits.
TILE_N, TILE_T = (4, 4) if has_wide_registers() else (2, 3)
ALIGN = 64  # bytes: a cache line, and one zmm


def aligned(x: np.ndarray) -> np.ndarray:
    """``x`` (C-contiguous float32) if its data starts on a cache line, else a copy that does
    (rows whose length is a multiple of LANES then all start on one)."""
    if x.ctypes.data % ALIGN == 0:
        return x
    buf = np.empty(x.size + ALIGN // 4, np.float32)
    first = (ALIGN - buf.ctypes.data % ALIGN) % ALIGN // 4
    out = buf[first : first + x.size].reshape(x.shape)
    out[...] = x
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _aligned_scratch(rows, cols):  # type: ignore[no-untyped-def]  # pragma: no cover
    """An uninitialised float32 (rows, cols) whose data starts on a cache line (Numba's own
    allocations are 32-byte aligned)."""
    buf = np.empty(rows * cols + ALIGN // 4, np.float32)
    first = (ALIGN - buf.ctypes.data % ALIGN) % ALIGN // 4
    return buf[first : first + rows * cols].reshape((rows, cols))


def _load_vf(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return load_vector(builder, ptr, LANES)


@intrinsic  # type: ignore[misc]
def decode_into(typingctx: Any, kind: Any, blocks: Any, n: Any, w: Any, r: Any) -> Any:
    """w[r] = decoded row n of ``blocks`` (``kind``: a value of
    :data:`~pagedattn.model.block_ir.KINDS`): float32, the same values the dot kernels meet,
    written LANES at a time."""
    sig = types.none(kind, blocks, n, w, r)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
        b_arr = Arr2D(context, builder, sig.args[1], args[1])
        w_arr = Arr2D(context, builder, sig.args[3], args[3])
        row, w_row = args[2], args[4]
        i64 = row.type

        def emit(kind: int) -> list[ir.Value]:
            elements, size = SHAPES[kind]

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                dec = decoder(builder, kind, b_arr.ptr(builder, row, builder.mul(b, i64(size))))
                for g in range(dec.groups):
                    for i, vec in enumerate(dec.group(g)):
                        col = builder.mul(b, i64(elements))
                        col = builder.add(col, i64(GROUP * g + LANES * i))
                        dst = builder.bitcast(w_arr.ptr(builder, w_row, col), VF.as_pointer())
                        builder.store(vec, dst, align=4)
                return accs

            carried_loop(builder, builder.sdiv(b_arr.shape[1], i64(size)), [], body)
            return []

        by_kind(builder, args[0], emit)
        return context.get_dummy_value()

    return sig, codegen


def _make_scratch_dot(rows: int, cols: int) -> Any:
    """Intrinsic (w, r0, x, t0) -> UniTuple(float32, rows * cols): dot(w[r0 + r], x[t0 + c]) at
    index ``r * cols + c``, for float32 ``w`` (a scratch filled by :func:`decode_into`)."""

    @intrinsic  # type: ignore[misc]
    def scratch_dot(typingctx: Any, w: Any, r0: Any, x: Any, t0: Any) -> Any:
        sig = types.UniTuple(types.float32, rows * cols)(w, r0, x, t0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            w_arr, x_arr = (
                Arr2D(context, builder, sig.args[0], args[0]),
                Arr2D(context, builder, sig.args[2], args[2]),
            )
            r_first, t_first = args[1], args[3]
            i64 = r_first.type
            num_steps = builder.sdiv(w_arr.shape[1], i64(LANES))
            accs = [ir.Constant(VF, [0.0] * LANES)] * (rows * cols)

            def body(step: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                accs = list(accs)
                k = builder.mul(step, i64(LANES))
                xs = [
                    _load_vf(builder, x_arr.ptr(builder, builder.add(t_first, i64(c)), k))
                    for c in range(cols)
                ]
                for r in range(rows):
                    wv = _load_vf(builder, w_arr.ptr(builder, builder.add(r_first, i64(r)), k))
                    for c in range(cols):
                        accs[r * cols + c] = fma(builder, wv, xs[c], accs[r * cols + c])
                return accs

            carried_loop(builder, num_steps, accs, body)
            return context.make_tuple(builder, sig.return_type, [hsum(builder, a) for a in accs])

        return sig, codegen

    return scratch_dot


_scratch_tile, _scratch_col = _make_scratch_dot(TILE_N, TILE_T), _make_scratch_dot(TILE_N, 1)
_scratch_one = _make_scratch_dot(1, 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _apply_rows(w, r0, count, x, out, n0):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, n0 + i] = dot(w[r0 + i], x[t]) for i < count and every t, in register tiles of
    TILE_N rows of w by TILE_T rows of x: each group of TILE_T rows of x meets all ``count``
    rows of w while it sits in L1, so x is read from memory once per task and w (one task's
    rows: 37 KB at 576 inputs) cycles through L1 / L2."""
    num_rows = x.shape[0]
    t = 0
    while t + TILE_T <= num_rows:
        r = 0
        while r + TILE_N <= count:
            s = _scratch_tile(w, r0 + r, x, t)
            for i in range(TILE_N):
                for c in range(TILE_T):
                    out[t + c, n0 + r + i] = s[i * TILE_T + c]
            r += TILE_N
        while r < count:
            for c in range(TILE_T):
                out[t + c, n0 + r] = _scratch_one(w, r0 + r, x, t + c)[0]
            r += 1
        t += TILE_T
    while t < num_rows:
        r = 0
        while r + TILE_N <= count:
            s1 = _scratch_col(w, r0 + r, x, t)
            for i in range(TILE_N):
                out[t, n0 + r + i] = s1[i]
            r += TILE_N
        while r < count:
            out[t, n0 + r] = _scratch_one(w, r0 + r, x, t)[0]
            r += 1
        t += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def qmatmul_tiled(
    x: np.ndarray, blocks: np.ndarray, kind: int, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """out[t, n] = dot(x[t], decoded row n), bitwise equal to :func:`qmatmul_blocks`: each task
    decodes its ROWS_PER_TASK rows once into a float32 scratch, then meets every activation row,
    TILE_N outputs by TILE_T rows per register tile, TILE_T rows of x at a time
    (:func:`_apply_rows`)."""
    num_in = x.shape[1]
    num_out = blocks.shape[0]
    for task in numba.prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        n0 = task * ROWS_PER_TASK
        count = min(num_out, n0 + ROWS_PER_TASK) - n0
        w = _aligned_scratch(ROWS_PER_TASK, num_in)
        for r in range(count):
            decode_into(kind, blocks, n0 + r, w, r)  # type: ignore[call-arg]
        _apply_rows(w, 0, count, x, out, n0)


@numba.njit(parallel=True, cache=True, nogil=True)
def matmul_float(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[t, n] = dot(x[t], w[n]) for float32 ``w`` (in_features a multiple of LANES), in the
    same lane order as the block kernels: float checkpoints are batch-invariant too."""
    num_out = w.shape[0]
    for task in numba.prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        n0 = task * ROWS_PER_TASK
        _apply_rows(w, n0, min(num_out, n0 + ROWS_PER_TASK) - n0, x, out, n0)
