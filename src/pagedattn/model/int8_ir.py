"""The int8 dot products of the int8-activation matmuls, one per x86 instruction set.

A block's 32 unsigned-by-signed byte products are summed four at a time into eight int32
lanes (lane ``j``: bytes ``4j`` to ``4j + 3``). Each instruction set computes exactly these
sums, so the float accumulation after it, and every result bit, is the same on all of them:

* ``avx2``: ``vpmaddubsw`` (byte pairs into int16, below saturation for these operands) and
  ``vpmaddwd`` by ones (int16 pairs into int32), on ymm;
* ``vnni-ymm``: one ``vpdpbusd`` (AVX512_VNNI with AVX512VL, or AVX-VNNI) on ymm;
* ``zmm``: ``vpmaddubsw`` + ``vpmaddwd`` on zmm (AVX512BW), two blocks' rows per register;
* ``vnni-zmm``: one ``vpdpbusd`` on zmm (AVX512_VNNI), two blocks' rows per register.

The path is chosen from the CPU Numba compiles for (:mod:`pagedattn.kernels.target`, which
asks LLVM), when the kernel is compiled: no other path's instructions are emitted, so a target
never meets an instruction it lacks (``NUMBA_CPU_NAME=haswell`` compiles the ``avx2`` path).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.simd_ir import F32, I8, I32, mask
from pagedattn.kernels.target import has_avx512bw, has_vnni_256, has_vnni_512
from pagedattn.model.block_ir import Q5_KINDS

I16 = ir.IntType(16)
V16I8 = ir.VectorType(I8, 16)
V32I8 = ir.VectorType(I8, 32)
V64I8 = ir.VectorType(I8, 64)
V8I32 = ir.VectorType(I32, 8)
V16I32 = ir.VectorType(I32, 16)
V8F = ir.VectorType(F32, 8)
V16F = ir.VectorType(F32, 16)

# what each path computes a block's products with (README, bench output)
INSTRUCTIONS = {
    "avx2": "AVX2 vpmaddubsw + vpmaddwd on ymm",
    "vnni-ymm": "VNNI vpdpbusd on ymm",
    "zmm": "AVX512BW vpmaddubsw + vpmaddwd on zmm",
    "vnni-zmm": "AVX512_VNNI vpdpbusd on zmm",
}

# a pair of rows' codes in one zmm: bytes 0-15 of each row's block, then bytes 16-31 of each,
# so that int32 lanes 0-3 and 8-11 are the first row's lanes 0-7, lanes 4-7 and 12-15 the
# second row's (the one shuffle of two ymm that vinserti64x4 and vpermt2q give)
PAIR_BYTES = mask([*range(16), *range(32, 48), *range(16, 32), *range(48, 64)])
PAIR_LANES = (mask([*range(4), *range(8, 12)]), mask([*range(4, 8), *range(12, 16)]))
_XQ_TWICE = mask([*range(16), *range(16), *range(16, 32), *range(16, 32)])
_SCALE_PAIR = mask([0] * 4 + [1] * 4 + [0] * 4 + [1] * 4)


def int8_path() -> str:
    """The path the target gets (a key of :data:`INSTRUCTIONS`); the target has AVX2."""
    if has_avx512bw():
        return "vnni-zmm" if has_vnni_512() else "zmm"
    return "vnni-ymm" if has_vnni_256() else "avx2"


def block_codes(builder: ir.IRBuilder, kind: int, codes: ir.Value) -> ir.Value:
    """A block's 32 codes (i8* at the first) as <32 x i8>: Q8_0's as stored; 4-bit ones as
    bytes 0-15 the low nibbles, 16-31 the high ones (inputs 0-15, then 16-31); Q5_0 / Q5_1's
    with bit j of the 32 bits before them (input j's fifth bit) as 16 in byte j."""
    if kind == 2:
        return builder.load(builder.bitcast(codes, V32I8.as_pointer()), align=1)
    packed = builder.load(builder.bitcast(codes, V16I8.as_pointer()), align=1)
    lo = builder.and_(packed, ir.Constant(V16I8, [15] * 16))
    hi = builder.lshr(packed, ir.Constant(V16I8, [4] * 16))
    nibbles = builder.shuffle_vector(lo, hi, mask(range(32)))
    if kind not in Q5_KINDS:
        return nibbles
    qh_ptr = builder.gep(codes, [ir.Constant(ir.IntType(64), -4)])
    qh = builder.load(builder.bitcast(qh_ptr, ir.VectorType(I8, 4).as_pointer()), align=1)
    spread = builder.shuffle_vector(qh, qh, mask([j // 8 for j in range(32)]))  # byte j // 8
    bit = builder.and_(
        spread, ir.Constant(V32I8, [(1 << (j % 8)) - (256 if j % 8 == 7 else 0) for j in range(32)])
    )
    fifth = builder.select(
        builder.icmp_unsigned("!=", bit, ir.Constant(V32I8, [0] * 32)),
        ir.Constant(V32I8, [16] * 32),
        ir.Constant(V32I8, [0] * 32),
    )
    return builder.or_(nibbles, fifth)


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def abs_bytes(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """|v| of a byte vector (``vpabsb``)."""
    name = f"llvm.abs.v{v.type.count}i8"
    return _x86(builder, name, v.type, [v, ir.IntType(1)(0)])


def signed_like(builder: ir.IRBuilder, codes: ir.Value, xq: ir.Value) -> ir.Value:
    """``codes`` with the sign of ``xq`` (0 where ``xq`` is 0 on ymm, ``vpsignb``; on zmm, which
    has no ``vpsignb``, ``codes`` there: it meets ``|xq| = 0``, the same product)."""
    if codes.type.count == 32:
        return _x86(builder, "llvm.x86.avx2.psign.b", V32I8, [codes, xq])
    negative = builder.icmp_signed("<", xq, ir.Constant(V64I8, [0] * 64))
    return builder.select(negative, builder.sub(ir.Constant(V64I8, [0] * 64), codes), codes)


def quads(builder: ir.IRBuilder, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    """int32 lane ``j`` = sum over bytes ``4j .. 4j + 3`` of ``unsigned * signed`` (unsigned
    bytes times signed bytes, no pair above int16's range), on 32 or 64 bytes."""
    wide = unsigned.type.count == 64
    lanes = V16I32 if wide else V8I32
    if has_vnni_512() if wide else has_vnni_256():
        name = "llvm.x86.avx512.vpdpbusd." + ("512" if wide else "256")
        u, s = (builder.bitcast(v, lanes) for v in (unsigned, signed))
        return _x86(builder, name, lanes, [ir.Constant(lanes, [0] * lanes.count), u, s])
    words = ir.VectorType(I16, lanes.count * 2)
    if wide:
        pairs = _x86(builder, "llvm.x86.avx512.pmaddubs.w.512", words, [unsigned, signed])
        ones = ir.Constant(words, [1] * words.count)
        return _x86(builder, "llvm.x86.avx512.pmaddw.d.512", lanes, [pairs, ones])
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", words, [unsigned, signed])
    ones = ir.Constant(words, [1] * words.count)
    return _x86(builder, "llvm.x86.avx2.pmadd.wd", lanes, [pairs, ones])


def xq_twice(builder: ir.IRBuilder, xq: ir.Value) -> ir.Value:
    """A block's 32 activation bytes laid out as :data:`PAIR_BYTES` lays a pair of rows."""
    return builder.shuffle_vector(xq, xq, _XQ_TWICE)


def scale_pair(builder: ir.IRBuilder, first: ir.Value, second: ir.Value) -> ir.Value:
    """<16 x float> of two rows' scales in the lanes :data:`PAIR_BYTES` gives each row."""
    two = ir.Constant(ir.VectorType(F32, 2), ir.Undefined)
    two = builder.insert_element(builder.insert_element(two, first, I32(0)), second, I32(1))
    return builder.shuffle_vector(two, two, _SCALE_PAIR)
