"""LLVM IR pieces of the GGUF block formats, shared by the float and the int8 matmul kernels.

The block formats are ggml's ``block_q4_0``, ``block_q4_1`` and ``block_q8_0``
(``ggml-common.h``): per 32 inputs a float16 scale, Q4_1's float16 minimum, then the codes
(4-bit pairs, or int8). A kind is the runtime integer Q4_0 = 0, Q4_1 = 1, Q8_0 = 2; an
intrinsic that serves every kind emits the three variants behind one switch on it
(:func:`by_kind`), outside its loop over blocks. Nothing here names a host-specific
instruction: the float16 fields widen through :func:`pagedattn.kernels.half_ir.widen_half_bits`.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.half_ir import widen_half_bits
from pagedattn.kernels.simd_ir import F32, I8, I32, fma, mask, splat

BLOCK = 32
LANES = 16  # float32 accumulator lanes per (output, input row): one zmm, or two ymm
STEPS = BLOCK // LANES  # accumulator steps per block

# kind -> (bytes per block, bytes before the codes, 4-bit codes?)
LAYOUT = {0: (18, 2, True), 1: (20, 4, True), 2: (34, 2, False)}

VF = ir.VectorType(F32, LANES)
_I16 = ir.IntType(16)
_I64 = ir.IntType(64)


def half_at(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The float16 at byte ``offset`` of ``block`` (i8*), exactly widened to float32."""
    ptr = builder.gep(block, [ir.Constant(_I64, offset)])
    return widen_half_bits(builder, builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1))


def scale_offset(builder: ir.IRBuilder, kind: int, block: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A block's float32 scale and offset, read from its own bytes (``block``: i8* at its first
    byte): the float16 scale, then Q4_1's float16 minimum, Q4_0's ``-8 * scale`` (its codes are
    stored + 8; exact) or Q8_0's 0."""
    d = half_at(builder, block, 0)
    if kind == 1:
        return d, half_at(builder, block, 2)
    if kind == 0:
        return d, builder.fmul(d, F32(-8.0))
    return d, F32(0.0)


def _part(builder: ir.IRBuilder, v: ir.Value, i: int) -> ir.Value:
    """Elements ``[i * LANES, (i + 1) * LANES)`` of vector ``v``."""
    return builder.shuffle_vector(v, v, mask(range(i * LANES, (i + 1) * LANES)))


def decoded_block(builder: ir.IRBuilder, kind: int, block: ir.Value) -> list[ir.Value]:
    """The 32 weights of the block at ``block`` (i8*) as STEPS <LANES x float>:
    fma(scale, code, offset) per input (the values of :func:`scale_offset`, splatted)."""
    d_scalar, m_scalar = scale_offset(builder, kind, block)
    d = splat(builder, d_scalar, LANES)
    m = splat(builder, m_scalar, LANES)
    codes = builder.gep(block, [ir.Constant(_I64, LAYOUT[kind][1])])
    if LAYOUT[kind][2]:
        # bytes j and 8 + j hold inputs j, 8 + j (low nibbles) and 16 + j, 24 + j (high): widen
        # each 8-byte half to int32 lanes (vpmovzxbd from memory), then mask and shift there
        i32x8 = ir.VectorType(I32, 8)
        halves = []
        for half in range(2):
            ptr = builder.gep(codes, [ir.Constant(_I64, 8 * half)])
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
    # codes are at most 255 in magnitude: the signed conversion is exact
    return [fma(builder, d, builder.sitofp(c, VF), m) for c in steps]


def by_kind(
    builder: ir.IRBuilder, kind: ir.Value, emit: Callable[[int], list[ir.Value]]
) -> list[ir.Value]:
    """``emit(k)`` for the block kind held by the runtime integer ``kind`` (Q4_0 = 0, Q4_1 = 1,
    Q8_0 otherwise), each variant in its own branch, the results merged through stack slots
    (which LLVM turns into phis). ``emit`` returns the same types for every kind."""
    slots: list[ir.Value] = []

    def run(k: int) -> None:
        values = emit(k)
        if not slots:
            slots.extend(cgutils.alloca_once(builder, v.type) for v in values)
        for slot, value in zip(slots, values, strict=True):
            builder.store(value, slot)

    with builder.if_else(builder.icmp_signed("==", kind, kind.type(0))) as (q4_0, other):
        with q4_0:
            run(0)
        with other, builder.if_else(builder.icmp_signed("==", kind, kind.type(1))) as (q4_1, q8_0):
            with q4_1:
                run(1)
            with q8_0:
                run(2)
    return [builder.load(s) for s in slots]
