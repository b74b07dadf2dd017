"""The scratch-tile matmuls: a task's weight rows decoded once into a float32 scratch, then met
by every activation row in register tiles (prefill and batched steps), and the same tiles over
float32 weights.

Each output takes the operation order :mod:`pagedattn.model.block_dot` defines (16 lane
accumulators, in-order fused multiply-adds, a halving sum), so :func:`qmatmul_tiled` equals
:func:`~pagedattn.model.block_dot.qmatmul_blocks` bit for bit and :func:`matmul_float` keeps
float checkpoints batch-invariant too.

Both operands start on a cache line (:mod:`pagedattn.kernels.aligned`): a vector load that
straddles two lines costs two, and the tiles issue one load per two multiply-adds, so a 16- or
32-byte aligned operand (NumPy's and Numba's allocations) made the tiles 25-40 % slower.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pagedattn.kernels.aligned import aligned_scratch
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
SPAN_STEPS = 32  # LANES-steps of x per span of a long row (512 inputs: 8 KB of 4 rows)
SPAN_MIN_STEPS = 96  # rows longer than this (1,536 inputs) go span by span


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
                dec = decoder(builder, kind, b_arr, row, b)
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


Rows = tuple[Arr2D, ir.Value]  # an operand and the first of the tile's rows in it


def _tile_steps(
    builder: ir.IRBuilder,
    w: Rows,
    x: Rows,
    steps: tuple[ir.Value, ir.Value],
    accs: list[ir.Value],
    cols: int,
) -> list[ir.Value]:
    """A tile's lane accumulators (index ``r * cols + c``: w's row r by x's row c) carried
    over LANES-input steps ``steps[0]`` .. ``steps[0] + steps[1]``."""
    (w_arr, r_first), (x_arr, t_first), (first_step, num_steps) = w, x, steps
    rows = len(accs) // cols
    i64 = r_first.type

    def body(step: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        accs = list(accs)
        k = builder.mul(builder.add(first_step, step), i64(LANES))
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
    return accs


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
            i64 = args[1].type
            zeros = [ir.Constant(VF, [0.0] * LANES)] * (rows * cols)
            num_steps = builder.sdiv(w_arr.shape[1], i64(LANES))
            accs = _tile_steps(
                builder, (w_arr, args[1]), (x_arr, args[3]), (i64(0), num_steps), zeros, cols
            )
            return context.make_tuple(builder, sig.return_type, [hsum(builder, a) for a in accs])

        return sig, codegen

    return scratch_dot


@intrinsic  # type: ignore[misc]
def _span_steps(
    typingctx: Any, w: Any, r0: Any, x: Any, t0: Any, s0: Any, s1: Any, acc: Any, a0: Any
) -> Any:
    """Continue a TILE_N x TILE_T tile's lane accumulators, rows ``a0 ..`` of float32 ``acc``
    (index ``r * TILE_T + c``), over LANES-input steps ``s0 .. s1``: the same fused
    multiply-adds in the same order as :func:`_make_scratch_dot`'s loop, in spans."""
    sig = types.none(w, r0, x, t0, s0, s1, acc, a0)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
        w_arr, x_arr, acc_arr = (Arr2D(context, builder, sig.args[i], args[i]) for i in (0, 2, 6))
        i64 = args[1].type
        zero = i64(0)
        slots = [
            builder.bitcast(acc_arr.ptr(builder, builder.add(args[7], i64(i)), zero),
                            VF.as_pointer())
            for i in range(TILE_N * TILE_T)
        ]  # fmt: skip
        accs = [builder.load(p, align=4) for p in slots]
        steps = (args[4], builder.sub(args[5], args[4]))
        accs = _tile_steps(builder, (w_arr, args[1]), (x_arr, args[3]), steps, accs, TILE_T)
        for p, a in zip(slots, accs, strict=True):
            builder.store(a, p, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic  # type: ignore[misc]
def _lane_sums(typingctx: Any, acc: Any, a0: Any) -> Any:
    """UniTuple(float32, TILE_N * TILE_T): rows ``a0 ..`` of ``acc`` each summed by halving
    (:func:`~pagedattn.kernels.simd_ir.hsum`, as the unspanned tiles end)."""
    sig = types.UniTuple(types.float32, TILE_N * TILE_T)(acc, a0)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
        acc_arr = Arr2D(context, builder, sig.args[0], args[0])
        i64 = args[1].type
        sums = [
            hsum(builder, _load_vf(builder, acc_arr.ptr(builder, builder.add(args[1], i64(i)),
                                                        i64(0))))
            for i in range(TILE_N * TILE_T)
        ]  # fmt: skip
        return context.make_tuple(builder, sig.return_type, sums)

    return sig, codegen


_scratch_tile, _scratch_col = _make_scratch_dot(TILE_N, TILE_T), _make_scratch_dot(TILE_N, 1)
_scratch_one = _make_scratch_dot(1, 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _apply_spans(w, r0, count, x, out, n0, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t + c, n0 + i] for c < TILE_T and i < count rounded down to TILE_N, span by span:
    every tile walks the inputs SPAN_STEPS LANES-steps at a time, all the tiles of a span
    before the next span, their accumulators in a small buffer between spans, so a span of
    the TILE_T rows of x stays in L1 while it meets every row of w."""
    steps = x.shape[1] // LANES
    groups = count // TILE_N
    acc = np.zeros((groups * TILE_N * TILE_T, LANES), np.float32)
    for s0 in range(0, steps, SPAN_STEPS):
        s1 = min(steps, s0 + SPAN_STEPS)
        for g in range(groups):
            _span_steps(w, r0 + g * TILE_N, x, t, s0, s1, acc, g * TILE_N * TILE_T)  # type: ignore[call-arg]
    for g in range(groups):
        s = _lane_sums(acc, g * TILE_N * TILE_T)  # type: ignore[call-arg,var-annotated]
        for i in range(TILE_N):
            for c in range(TILE_T):
                out[t + c, n0 + g * TILE_N + i] = s[i * TILE_T + c]


@numba.njit(cache=True, nogil=True, inline="always")
def _apply_rows(w, r0, count, x, out, n0):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, n0 + i] = dot(w[r0 + i], x[t]) for i < count and every t, in register tiles of
    TILE_N rows of w by TILE_T rows of x: each group of TILE_T rows of x meets all ``count``
    rows of w while it sits in L1, so x is read from memory once per task and w (one task's
    rows: 37 KB at 576 inputs) cycles through L1 / L2. Rows longer than SPAN_MIN_STEPS
    LANES-steps (whose TILE_T rows would not stay in L1) go span by span
    (:func:`_apply_spans`)."""
    num_rows = x.shape[0]
    spans = x.shape[1] // LANES > SPAN_MIN_STEPS
    t = 0
    while t + TILE_T <= num_rows:
        r = 0
        if spans:
            _apply_spans(w, r0, count, x, out, n0, t)
            r = count // TILE_N * TILE_N
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
        w = aligned_scratch(ROWS_PER_TASK, num_in)
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
