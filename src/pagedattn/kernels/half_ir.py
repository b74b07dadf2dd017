"""float16 <-> float32 conversions in LLVM IR that need no runtime routine on any CPU.

Where the target converts in hardware (F16C on x86, every aarch64;
:func:`pagedattn.kernels.target.native_half_conversion`) the conversions are LLVM's ``fpext`` /
``fptrunc`` on ``half`` (``vcvtph2ps`` / ``vcvtps2ph``). Elsewhere (baseline x86-64, AVX
without F16C) LLVM would lower them to calls of ``__extendhfsf2`` / ``__truncsfhf2``, which
nothing in a Numba process links; there they are the integer and float32 sequences below.
Both give the same bits for every non-NaN input: widening is exact, and narrowing rounds to
the nearest half, ties to even, overflowing to infinity (tests compare both with NumPy's
``astype`` over every half and around every rounding boundary). A NaN stays a quiet NaN.

Scalars (``i16`` / ``float``) and vectors (``<N x i16>`` / ``<N x float>``) alike.
"""

from __future__ import annotations

from llvmlite import ir

from pagedattn.kernels.target import native_half_conversion

_F32 = ir.FloatType()
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)


def _like(value: ir.Value, element: ir.Type) -> ir.Type:
    """``element``, or a vector of it as wide as ``value``."""
    ty = value.type
    return ir.VectorType(element, ty.count) if isinstance(ty, ir.VectorType) else element


def _const(ty: ir.Type, value: int | float) -> ir.Constant:
    """``value`` as ``ty`` (integers above the signed range as their two's complement)."""
    element = ty.element if isinstance(ty, ir.VectorType) else ty
    if isinstance(element, ir.IntType) and isinstance(value, int) and value >= 1 << 31:
        value -= 1 << 32
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def widen_half_bits_portable(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """float32 value of the IEEE half whose bits are ``bits``, with integer operations and
    one exact float32 product: normal halves rebias their exponent (15 -> 127), subnormals are
    ``code * 2^-24`` (at most 1023, so exact), infinities and NaNs take exponent 255 (NaNs
    quieted, as ``vcvtph2ps`` does)."""
    i32, f32 = _like(bits, _I32), _like(bits, _F32)
    w = builder.zext(bits, i32)
    sign = builder.shl(builder.and_(w, _const(i32, 0x8000)), _const(i32, 16))
    magnitude = builder.and_(w, _const(i32, 0x7FFF))
    shifted = builder.shl(magnitude, _const(i32, 13))
    normal = builder.add(shifted, _const(i32, 112 << 23))
    inf_nan = builder.or_(shifted, _const(i32, 0x7F800000))
    is_nan = builder.icmp_unsigned(">", magnitude, _const(i32, 0x7C00))
    inf_nan = builder.select(is_nan, builder.or_(inf_nan, _const(i32, 0x00400000)), inf_nan)
    tiny = builder.fmul(builder.sitofp(magnitude, f32), _const(f32, 2.0**-24))
    subnormal = builder.bitcast(tiny, i32)
    big = builder.select(
        builder.icmp_unsigned(">=", magnitude, _const(i32, 0x7C00)), inf_nan, normal
    )
    small = builder.icmp_unsigned("<", magnitude, _const(i32, 0x0400))
    return builder.bitcast(builder.or_(builder.select(small, subnormal, big), sign), f32)


def narrow_to_half_bits_portable(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Bits (i16) of float32 ``value`` rounded to the nearest half, ties to even (NaN: the
    quiet NaN 0x7E00 with its sign). The float32 additions do the rounding: ``|x| * 2^112 *
    2^-110`` overflows to infinity exactly where the half does, and adding a power of two
    whose ulp is the half's ulp at that exponent (never below the subnormal step 2^-24) leaves
    the rounded half's exponent and mantissa in the sum's bits (M. Dukhan's ``FP16`` library,
    ``fp16_ieee_from_fp32_value``)."""
    i32, f32 = _like(value, _I32), _like(value, _F32)
    w = builder.bitcast(value, i32)
    twice = builder.add(w, w)
    sign = builder.and_(w, _const(i32, 0x80000000))
    bias = builder.and_(twice, _const(i32, 0xFF000000))
    floor = _const(i32, 0x71000000)
    bias = builder.select(builder.icmp_unsigned("<", bias, floor), floor, bias)
    magnitude = builder.bitcast(builder.and_(w, _const(i32, 0x7FFFFFFF)), f32)
    base = builder.fmul(builder.fmul(magnitude, _const(f32, 2.0**112)), _const(f32, 2.0**-110))
    offset = builder.add(builder.lshr(bias, _const(i32, 1)), _const(i32, 0x07800000))
    rounded = builder.bitcast(builder.fadd(builder.bitcast(offset, f32), base), i32)
    exponent = builder.and_(builder.lshr(rounded, _const(i32, 13)), _const(i32, 0x7C00))
    mantissa = builder.and_(rounded, _const(i32, 0x0FFF))
    finite = builder.add(exponent, mantissa)
    is_nan = builder.icmp_unsigned(">", twice, _const(i32, 0xFF000000))
    bits = builder.or_(
        builder.lshr(sign, _const(i32, 16)), builder.select(is_nan, _const(i32, 0x7E00), finite)
    )
    return builder.trunc(bits, _like(value, _I16))


def widen_half_bits(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """float32 value of the half(s) whose bits are the i16 ``bits`` (exact)."""
    if not native_half_conversion():
        return widen_half_bits_portable(builder, bits)
    return builder.fpext(builder.bitcast(bits, _like(bits, ir.HalfType())), _like(bits, _F32))


def narrow_to_half_bits(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Bits (i16) of float32 ``value`` rounded to the nearest half, ties to even."""
    if not native_half_conversion():
        return narrow_to_half_bits_portable(builder, value)
    return builder.bitcast(builder.fptrunc(value, _like(value, ir.HalfType())), _like(value, _I16))
