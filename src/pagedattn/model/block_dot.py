"""Dot products of GGUF block-quantized rows with float32 activations, written as explicit SIMD.

Every ``out[t, n]`` is one fixed sequence of float32 operations, the same whichever kernel
computes it and on every x86-64 host:

* weights are decoded as ``w = fma(scale, code, offset)``: exactly ``gguf.quants.dequantize``
  (``scale * code`` of a float16 scale and a 4- or 8-bit code is exact in float32);
* ``LANES`` = 16 lane accumulators: lane ``l`` takes ``acc[l] = fma(w[k], x[k], acc[l])`` for
  ``k = l, l + 16, l + 32, ...`` in increasing ``k`` (a block of 32 inputs is two steps);
* the lanes are summed by halving: ``acc[i] += acc[i + 8]``, then ``+ 4``, ``+ 2``, ``+ 1``.

The operations are LLVM vector IR emitted through Numba intrinsics (``<16 x float>``,
``llvm.fma``, no fast-math flags), so LLVM may not reassociate them: it picks the instructions
(two ymm halves with AVX2 + FMA, one zmm with AVX-512) but never the rounding. Two kernels share
that definition:

* :func:`qmatmul_blocks` decodes each block in registers, four output rows side by side, and
  meets each activation row (decode steps, where every weight is used once); it prefetches the
  rows two tiles ahead, since interleaved rows defeat the hardware stream prefetcher;
* :func:`qmatmul_tiled` decodes a task's rows once into a float32 scratch that every activation
  row then meets in register tiles of ``TILE_N`` outputs by ``TILE_T`` rows (prefill, batches).

They agree bit for bit (``tests/model/test_block_dot.py``), which keeps a token's logits the
same alone or in any batch; :func:`matmul_float` applies the same order to float32 weights. The
block formats are ggml's ``block_q4_0``, ``block_q4_1`` and ``block_q8_0`` (``ggml-common.h``);
llama.cpp's own CPU path instead quantizes the activations to int8 (``ggml_vec_dot_q4_1_q8_1``),
which does less work per weight and is not exact.
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import pagedattn.kernels  # noqa: F401  (starts Numba's pool with a short OpenMP spin)
from pagedattn.kernels.simd_ir import (
    F32,
    I8,
    I32,
    Arr2D,
    carried_loop,
    fma,
    hsum,
    load_vector,
    mask,
    prefetch,
    splat,
)

BLOCK = 32
LANES = 16  # float32 accumulator lanes per (output, input row): one zmm, or two ymm
STEPS = BLOCK // LANES  # accumulator steps per block
ROWS_PER_TASK = 16  # output rows one thread owns
DECODE_TILE = 4  # output rows decoded side by side in registers (decode kernel)
TILE_N = 2  # output rows per register tile
TILE_T = 3  # activation rows per register tile (scratch kernel)

# kind -> (bytes per block, bytes before the codes, 4-bit codes?)
_LAYOUT = {0: (18, 2, True), 1: (20, 4, True), 2: (34, 2, False)}  # Q4_0, Q4_1, Q8_0

_VF = ir.VectorType(F32, LANES)


def _load_vf(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return load_vector(builder, ptr, LANES)


_HALF = ir.HalfType()


def _scale_offset(builder: ir.IRBuilder, kind: int, block: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A block's float32 scale and offset, read from its own bytes (``block``: i8* at its first
    byte): the float16 scale (exactly widened), then Q4_1's float16 minimum, Q4_0's
    ``-8 * scale`` (its codes are stored + 8; exact) or Q8_0's 0."""

    def half_at(offset: int) -> ir.Value:
        ptr = builder.gep(block, [ir.Constant(ir.IntType(64), offset)])
        value = builder.load(builder.bitcast(ptr, _HALF.as_pointer()), align=1)
        return builder.fpext(value, F32)

    d = half_at(0)
    if kind == 1:
        return d, half_at(2)
    if kind == 0:
        return d, builder.fmul(d, F32(-8.0))
    return d, F32(0.0)


def _part(builder: ir.IRBuilder, v: ir.Value, i: int) -> ir.Value:
    """Elements ``[i * LANES, (i + 1) * LANES)`` of vector ``v``."""
    return builder.shuffle_vector(v, v, mask(range(i * LANES, (i + 1) * LANES)))


def _splat_half(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """<LANES x float> of the float16 at byte ``offset`` of ``block``, exactly widened
    (splatted as float16, then converted: a broadcast and one vcvtph2ps)."""
    ptr = builder.gep(block, [ir.Constant(ir.IntType(64), offset)])
    value = builder.load(builder.bitcast(ptr, _HALF.as_pointer()), align=1)
    one = builder.insert_element(ir.Constant(ir.VectorType(_HALF, 1), ir.Undefined), value, I32(0))
    return builder.fpext(builder.shuffle_vector(one, one, mask([0] * LANES)), _VF)


def _decoded_block(builder: ir.IRBuilder, kind: int, block: ir.Value) -> list[ir.Value]:
    """The 32 weights of the block at ``block`` (i8*) as STEPS <LANES x float>:
    fma(scale, code, offset) per input (the values of :func:`_scale_offset`, as vectors)."""
    d = _splat_half(builder, block, 0)
    if kind == 1:
        m = _splat_half(builder, block, 2)
    elif kind == 0:
        m = builder.fmul(d, splat(builder, F32(-8.0), LANES))  # exact: a float16 times 8
    else:
        m = ir.Constant(_VF, [0.0] * LANES)
    codes = builder.gep(block, [ir.Constant(ir.IntType(64), _LAYOUT[kind][1])])
    if _LAYOUT[kind][2]:
        # bytes j and 8 + j hold inputs j, 8 + j (low nibbles) and 16 + j, 24 + j (high): widen
        # each 8-byte half to int32 lanes (vpmovzxbd from memory), then mask and shift there
        i32x8 = ir.VectorType(I32, 8)
        halves = []
        for half in range(2):
            ptr = builder.gep(codes, [ir.Constant(ir.IntType(64), 8 * half)])
            raw = builder.load(builder.bitcast(ptr, ir.VectorType(I8, 8).as_pointer()), align=1)
            halves.append(builder.zext(raw, i32x8))
        low = [builder.and_(h, ir.Constant(i32x8, [15] * 8)) for h in halves]
        high = [builder.lshr(h, ir.Constant(i32x8, [4] * 8)) for h in halves]
        steps = [builder.shuffle_vector(a, b, mask(range(LANES))) for a, b in (low, high)]
    else:
        raw = builder.load(builder.bitcast(codes, ir.VectorType(I8, 32).as_pointer()), align=1)
        steps = [
            builder.sext(_part(builder, raw, i), ir.VectorType(I32, LANES)) for i in range(STEPS)
        ]
    # codes are at most 255 in magnitude: the signed conversion is exact (AVX2 has no unsigned)
    return [fma(builder, d, builder.sitofp(c, _VF), m) for c in steps]


def _make_decode_dot(kind: int, rows: int) -> Any:
    """Intrinsic (blocks, n0, x, t) -> UniTuple(float32, rows): out[t, n0 + r]."""
    size = _LAYOUT[kind][0]

    @intrinsic  # type: ignore[misc]
    def decode_dot(typingctx: Any, blocks: Any, n0: Any, x: Any, t: Any) -> Any:
        sig = types.UniTuple(types.float32, rows)(blocks, n0, x, t)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            b_arr = Arr2D(context, builder, sig.args[0], args[0])
            x_arr = Arr2D(context, builder, sig.args[2], args[2])
            n_first, t_row = args[1], args[3]
            i64 = n_first.type
            accs = [ir.Constant(_VF, [0.0] * LANES)] * rows

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                k = builder.mul(b, i64(BLOCK))
                xs = [
                    _load_vf(builder, x_arr.ptr(builder, t_row, builder.add(k, i64(LANES * i))))
                    for i in range(STEPS)
                ]
                start = builder.mul(b, i64(size))
                out = []
                for r in range(rows):
                    n = builder.add(n_first, i64(r))
                    # the next tile's rows: several interleaved rows defeat the stream prefetcher
                    prefetch(builder, b_arr.ptr(builder, builder.add(n, i64(2 * rows)), start))
                    acc = accs[r]
                    for w, xv in zip(
                        _decoded_block(builder, kind, b_arr.ptr(builder, n, start)), xs, strict=True
                    ):
                        acc = fma(builder, w, xv, acc)
                    out.append(acc)
                return out

            num_blocks = builder.sdiv(b_arr.shape[1], i64(size))
            carried_loop(builder, num_blocks, accs, body)
            return context.make_tuple(builder, sig.return_type, [hsum(builder, a) for a in accs])

        return sig, codegen

    return decode_dot


def _make_decode_into(kind: int) -> Any:
    """Intrinsic (blocks, n, w, r) -> None: w[r] = decoded row n (float32, the same values the
    dot kernels meet), written LANES at a time."""
    size = _LAYOUT[kind][0]

    @intrinsic  # type: ignore[misc]
    def decode_into(typingctx: Any, blocks: Any, n: Any, w: Any, r: Any) -> Any:
        sig = types.none(blocks, n, w, r)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            b_arr = Arr2D(context, builder, sig.args[0], args[0])
            w_arr = Arr2D(context, builder, sig.args[2], args[2])
            row, w_row = args[1], args[3]
            i64 = row.type

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                block = b_arr.ptr(builder, row, builder.mul(b, i64(size)))
                for i, vec in enumerate(_decoded_block(builder, kind, block)):
                    col = builder.add(builder.mul(b, i64(BLOCK)), i64(LANES * i))
                    dst = builder.bitcast(w_arr.ptr(builder, w_row, col), _VF.as_pointer())
                    builder.store(vec, dst, align=4)
                return accs

            carried_loop(builder, builder.sdiv(b_arr.shape[1], i64(size)), [], body)
            return context.get_dummy_value()

        return sig, codegen

    return decode_into


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
            accs = [ir.Constant(_VF, [0.0] * LANES)] * (rows * cols)

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


_q4_0_by4, _q4_0_by1 = _make_decode_dot(0, DECODE_TILE), _make_decode_dot(0, 1)
_q4_1_by4, _q4_1_by1 = _make_decode_dot(1, DECODE_TILE), _make_decode_dot(1, 1)
_q8_0_by4, _q8_0_by1 = _make_decode_dot(2, DECODE_TILE), _make_decode_dot(2, 1)
_scratch_tile, _scratch_col = _make_scratch_dot(TILE_N, TILE_T), _make_scratch_dot(TILE_N, 1)
_scratch_one = _make_scratch_dot(1, 1)


_into_q4_0, _into_q4_1, _into_q8_0 = (_make_decode_into(k) for k in (0, 1, 2))


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_dot4(kind, blocks, n, x, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    if kind == 0:
        return _q4_0_by4(blocks, n, x, t)
    if kind == 1:
        return _q4_1_by4(blocks, n, x, t)
    return _q8_0_by4(blocks, n, x, t)


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_dot1(kind, blocks, n, x, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    if kind == 0:
        return _q4_0_by1(blocks, n, x, t)[0]
    if kind == 1:
        return _q4_1_by1(blocks, n, x, t)[0]
    return _q8_0_by1(blocks, n, x, t)[0]


@numba.njit(cache=True, nogil=True, inline="always")
def decode_into(kind, blocks, n, w, r):  # type: ignore[no-untyped-def]  # pragma: no cover
    """w[r] = decoded row n of ``blocks`` (``kind``: Q4_0 = 0, Q4_1 = 1, Q8_0 = 2)."""
    if kind == 0:
        _into_q4_0(blocks, n, w, r)
    elif kind == 1:
        _into_q4_1(blocks, n, w, r)
    else:
        _into_q8_0(blocks, n, w, r)


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_task(x, blocks, kind, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, col + n] = dot(x[t], decoded row n) for the ROWS_PER_TASK rows of ``task``."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    for t in range(x.shape[0]):
        n = n0
        while n + DECODE_TILE <= n1:
            r = _decode_dot4(kind, blocks, n, x, t)
            for i in range(DECODE_TILE):
                out[t, col + n + i] = r[i]
            n += DECODE_TILE
        while n < n1:
            out[t, col + n] = _decode_dot1(kind, blocks, n, x, t)
            n += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _num_tasks(rows):  # type: ignore[no-untyped-def]  # pragma: no cover
    return (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK


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
        w = np.empty((ROWS_PER_TASK, num_in), np.float32)
        for r in range(count):
            decode_into(kind, blocks, n0 + r, w, r)
        _apply_rows(w, 0, count, x, out, n0)


@numba.njit(parallel=True, cache=True, nogil=True)
def matmul_float(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[t, n] = dot(x[t], w[n]) for float32 ``w`` (in_features a multiple of LANES), in the
    same lane order as the block kernels: float checkpoints are batch-invariant too."""
    num_out = w.shape[0]
    for task in numba.prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        n0 = task * ROWS_PER_TASK
        _apply_rows(w, n0, min(num_out, n0 + ROWS_PER_TASK) - n0, x, out, n0)


# --- int8 activations (opt-in, not exact) -------------------------------------------------------
#
# llama.cpp's CPU path (``ggml_vec_dot_q4_1_q8_1``, ``ggml_vec_dot_q8_0_q8_0``): each 32-input
# block of an activation row is quantized to int8 with a float scale ``dx = max|x| / 127``; a
# block's dot product is then ``d * dx * sum(code * xq) + offset * dx * sum(xq)`` (Q8_0: no
# offset), with the integer sum from AVX2's ``vpmaddubsw`` (unsigned times signed int8, pairwise
# into int16: at most 2 * 15 * 127 for 4-bit codes, 2 * 127 * 127 for Q8_0's; no saturation) and
# ``vpmaddwd`` (pairs into int32). Every (row, output) is the same sequence of operations for
# any row count: batch invariance holds on this path too.

_V16I8 = ir.VectorType(I8, 16)
_V32I8 = ir.VectorType(I8, 32)
_V16I16 = ir.VectorType(ir.IntType(16), 16)
_V8I32 = ir.VectorType(I32, 8)
_V8F = ir.VectorType(F32, 8)


@functools.cache
def host_has_avx2() -> bool:
    """True when the CPU Numba compiles for has AVX2 (the int8 kernels' instructions)."""
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get("avx2", False))


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _make_int8_dot(kind: int, rows: int, cols: int) -> Any:
    """Intrinsic (blocks, n0, xq, xd, xs, t0) -> UniTuple(float32, rows * cols): at index
    ``r * cols + c``, out[t0 + c, n0 + r] from int8 activations ``xq`` (T, K), block scales
    ``xd`` and sums ``xs`` (T, K / 32); Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 (ggml's
    ``ggml_vec_dot_q8_0_q8_0``: signed codes, so ``vpmaddubsw`` takes ``|xq|`` and the codes
    with ``xq``'s sign (``vpsignb``); a product pair is at most 2 * 127 * 127, below int16's
    limit, as ``|xq| <= 127``). A block's codes are unpacked once for the ``cols`` activation
    rows; every output is the same operations whatever ``rows`` and ``cols`` are."""
    size, header, _ = _LAYOUT[kind]
    tile = rows * cols

    @intrinsic  # type: ignore[misc]
    def int8_dot(
        typingctx: Any,
        blocks: Any,
        n0: Any,
        xq: Any,
        xd: Any,
        xs: Any,
        t0: Any,
    ) -> Any:
        sig = types.UniTuple(types.float32, tile)(blocks, n0, xq, xd, xs, t0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            b_arr, q_arr, d_arr, x_arr = (
                Arr2D(context, builder, sig.args[i], args[i]) for i in (0, 2, 3, 4)
            )
            n_first, t_first = args[1], args[5]
            i64 = n_first.type
            ones = ir.Constant(_V16I16, [1] * 16)
            accs = [ir.Constant(_V8F, [0.0] * 8)] * tile + [F32(0.0)] * tile

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                k = builder.mul(b, i64(BLOCK))
                xqv, abs_xq, dx, sx = [], [], [], []
                for c in range(cols):
                    t_row = builder.add(t_first, i64(c))
                    q_ptr = builder.bitcast(q_arr.ptr(builder, t_row, k), _V32I8.as_pointer())
                    xqv.append(builder.load(q_ptr, align=1))
                    # |xq| (vpabsb, once per block for every row): Q8_0's unsigned operand
                    abs_xq.append(
                        _x86(builder, "llvm.abs.v32i8", _V32I8, [xqv[c], ir.IntType(1)(0)])
                    )
                    dx.append(builder.load(d_arr.ptr(builder, t_row, b)))
                    sx.append(builder.load(x_arr.ptr(builder, t_row, b)))
                vec, off = list(accs[:tile]), list(accs[tile:])
                for r in range(rows):
                    n = builder.add(n_first, i64(r))
                    start = builder.mul(b, i64(size))
                    block = b_arr.ptr(builder, n, start)
                    codes = builder.gep(block, [i64(header)])
                    prefetch(builder, b_arr.ptr(builder, builder.add(n, i64(2 * rows)), start))
                    if kind == 2:
                        codes32 = builder.load(builder.bitcast(codes, _V32I8.as_pointer()), align=1)
                    else:
                        packed = builder.load(builder.bitcast(codes, _V16I8.as_pointer()), align=1)
                        lo = builder.and_(packed, ir.Constant(_V16I8, [15] * 16))
                        hi = builder.lshr(packed, ir.Constant(_V16I8, [4] * 16))
                        codes32 = builder.shuffle_vector(lo, hi, mask(range(BLOCK)))
                    d, m = _scale_offset(builder, kind, block)
                    for c in range(cols):
                        i = r * cols + c
                        if kind == 2:
                            signed = _x86(
                                builder, "llvm.x86.avx2.psign.b", _V32I8, [codes32, xqv[c]]
                            )
                            pairs = _x86(
                                builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [abs_xq[c], signed]
                            )
                        else:
                            pairs = _x86(
                                builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [codes32, xqv[c]]
                            )
                        quads = _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, ones])
                        ddx = splat(builder, builder.fmul(d, dx[c]), 8)
                        vec[i] = fma(builder, ddx, builder.sitofp(quads, _V8F), vec[i])
                        if kind != 2:  # Q8_0 has no offset
                            off[i] = fma(builder, m, sx[c], off[i])
                return vec + off

            carried_loop(builder, builder.sdiv(b_arr.shape[1], i64(size)), accs, body)
            sums = [builder.fadd(hsum(builder, accs[i]), accs[tile + i]) for i in range(tile)]
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    return int8_dot


INT8_COLS = 2  # activation rows per int8 register tile (several rows: prefill, batches)


def _int8_tiles(kind: int) -> tuple[Any, Any, Any]:
    """A kind's int8 tiles: DECODE_TILE output rows x INT8_COLS activation rows, x 1, and 1 x 1."""
    return (
        _make_int8_dot(kind, DECODE_TILE, INT8_COLS),
        _make_int8_dot(kind, DECODE_TILE, 1),
        _make_int8_dot(kind, 1, 1),
    )


_i8_q4_0_x2, _i8_q4_0_x1, _i8_q4_0_one = _int8_tiles(0)
_i8_q4_1_x2, _i8_q4_1_x1, _i8_q4_1_one = _int8_tiles(1)
_i8_q8_0_x2, _i8_q8_0_x1, _i8_q8_0_one = _int8_tiles(2)


@numba.njit(cache=True, nogil=True, inline="always")
def _quantize_row(x, t, xq, xd, xs):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Row ``t`` of :func:`quantize_activations`."""
    for b in range(x.shape[1] // BLOCK):
        amax = np.float32(0.0)
        for j in range(b * BLOCK, (b + 1) * BLOCK):
            amax = max(amax, abs(x[t, j]))
        d = amax / np.float32(127.0)
        inv = np.float32(0.0) if d == 0 else np.float32(1.0) / d
        total = 0
        for j in range(b * BLOCK, (b + 1) * BLOCK):
            q = np.int8(np.rint(x[t, j] * inv))
            xq[t, j] = q
            total += int(q)
        xd[t, b] = d
        xs[t, b] = d * np.float32(total)


@numba.njit(parallel=True, cache=True, nogil=True)
def quantize_activations(
    x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Per 32-input block of each row of ``x`` (T, K) float32 (ggml's ``quantize_row_q8_1``):
    ``xd = max|x| / 127``, ``xq = rint(x / xd)`` int8 (zeros for an all-zero block) and
    ``xs = xd * sum(xq)``, the sum of the quantized block: the kernel then computes exactly
    ``W @ (xd * xq)``, whose rounding errors meet the centred weights ``scale * code +
    offset`` (summing the unquantized ``x`` for the offset term would leave
    ``scale * sum(code * error)``, several times larger). Parallel over rows; the same values
    as :func:`quantize_activations_serial`."""
    for t in numba.prange(x.shape[0]):
        _quantize_row(x, t, xq, xd, xs)


@numba.njit(cache=True, nogil=True)
def quantize_activations_serial(
    x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray
) -> None:  # pragma: no cover - compiled
    """:func:`quantize_activations` on the calling thread (a decode step's one or two rows:
    waking the thread pool costs more than the rows)."""
    for t in range(x.shape[0]):
        _quantize_row(x, t, xq, xd, xs)


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_tile(kind, blocks, n, xq, xd, xs, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t + c, n + r] at ``r * INT8_COLS + c`` (DECODE_TILE x INT8_COLS)."""
    if kind == 0:
        return _i8_q4_0_x2(blocks, n, xq, xd, xs, t)
    if kind == 1:
        return _i8_q4_1_x2(blocks, n, xq, xd, xs, t)
    return _i8_q8_0_x2(blocks, n, xq, xd, xs, t)


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_col(kind, blocks, n, xq, xd, xs, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, n + r] at ``r`` (DECODE_TILE x 1)."""
    if kind == 0:
        return _i8_q4_0_x1(blocks, n, xq, xd, xs, t)
    if kind == 1:
        return _i8_q4_1_x1(blocks, n, xq, xd, xs, t)
    return _i8_q8_0_x1(blocks, n, xq, xd, xs, t)


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_one(kind, blocks, n, xq, xd, xs, t):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, n]."""
    if kind == 0:
        return _i8_q4_0_one(blocks, n, xq, xd, xs, t)[0]
    if kind == 1:
        return _i8_q4_1_one(blocks, n, xq, xd, xs, t)[0]
    return _i8_q8_0_one(blocks, n, xq, xd, xs, t)[0]


@numba.njit(cache=True, nogil=True, inline="always")
def _int8_task(xq, xd, xs, blocks, kind, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, col + n] from int8 activations for the ROWS_PER_TASK rows of ``task``: tiles of
    DECODE_TILE output rows by INT8_COLS activation rows, then the leftover rows one by one."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    num_rows = xq.shape[0]
    t = 0
    while t < num_rows:
        cols = INT8_COLS if t + INT8_COLS <= num_rows else 1
        n = n0
        while n + DECODE_TILE <= n1:
            if cols == INT8_COLS:
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
                out[t + c, col + n] = _int8_one(kind, blocks, n, xq, xd, xs, t + c)
            n += 1
        t += cols


@numba.njit(cache=True, nogil=True, inline="always")
def _part_task(x, xq, xd, xs, use_int8, blocks, kind, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """One task of one part: int8 activations when ``use_int8``, else the exact in-register
    decode."""
    if use_int8:
        _int8_task(xq, xd, xs, blocks, kind, task, out, col)
    else:
        _decode_task(x, blocks, kind, task, out, col)


@numba.njit(parallel=True, cache=True, nogil=True)
def qmatmul_blocks(
    x: np.ndarray,
    xq: np.ndarray,
    xd: np.ndarray,
    xs: np.ndarray,
    use_int8: bool,
    b0: np.ndarray,
    b1: np.ndarray,
    b2: np.ndarray,
    kinds: tuple[int, int, int],
    num_parts: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``out = x @ concat(b0, b1, b2)[:num_parts].T`` in one parallel launch over tasks of
    ROWS_PER_TASK output rows, each block decoded in registers and met by every row of ``x``
    (decode steps; with ``use_int8``, every row count), DECODE_TILE output rows side by side
    (int8: by INT8_COLS rows of ``x``, each block's codes unpacked once for them).

    x: (T, K) float32; xq (T, K) int8, xd / xs (T, K / 32) float32 from
    :func:`quantize_activations` when ``use_int8`` (else unused, may be empty); b0..b2: block
    rows of ``kinds`` (Q4_0 = 0, Q4_1 = 1, Q8_0 = 2), parts past ``num_parts`` (1 to 3) ignored;
    out: (T, sum of the parts' rows) float32, their columns side by side (q|k|v, gate|up: one
    thread-pool wake-up instead of three). Each output is the same operations whatever parts
    share the launch and whatever T is."""
    t0 = _num_tasks(b0.shape[0])
    t1 = _num_tasks(b1.shape[0]) if num_parts > 1 else 0
    t2 = _num_tasks(b2.shape[0]) if num_parts > 2 else 0
    for task in numba.prange(t0 + t1 + t2):
        if task < t0:
            _part_task(x, xq, xd, xs, use_int8, b0, kinds[0], task, out, 0)
        elif task < t0 + t1:
            _part_task(x, xq, xd, xs, use_int8, b1, kinds[1], task - t0, out, b0.shape[0])
        else:
            col = b0.shape[0] + b1.shape[0]
            _part_task(x, xq, xd, xs, use_int8, b2, kinds[2], task - t0 - t1, out, col)
