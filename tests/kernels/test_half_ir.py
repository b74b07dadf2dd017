"""The float16 conversions for CPUs without hardware support (kernels/half_ir.py): every half
widens and float32 values around every rounding boundary narrow exactly as NumPy's ``astype``
does, on scalars and on vectors. They are compiled here on a host that has F16C, so the
hardware path cannot stand in for them."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pagedattn.kernels.half_ir import narrow_to_half_bits_portable, widen_half_bits_portable
from pagedattn.kernels.simd_ir import Arr2D

LANES = 8


@intrinsic
def _widen_one(typingctx: Any, bits: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return widen_half_bits_portable(builder, args[0])

    return types.float32(types.uint16), codegen


@intrinsic
def _narrow_one(typingctx: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return narrow_to_half_bits_portable(builder, args[0])

    return types.uint16(types.float32), codegen


@intrinsic
def _widen_row(typingctx: Any, src: Any, dst: Any, row: Any) -> Any:
    """dst[row, :8] = widen(src[row, :8]) as one <8 x i16> -> <8 x float> sequence."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        s = Arr2D(context, builder, sig.args[0], args[0])
        d = Arr2D(context, builder, sig.args[1], args[1])
        zero = args[2].type(0)
        i16x8 = ir.VectorType(ir.IntType(16), LANES)
        bits = builder.load(
            builder.bitcast(s.ptr(builder, args[2], zero), i16x8.as_pointer()), align=2
        )
        wide = widen_half_bits_portable(builder, bits)
        builder.store(
            wide, builder.bitcast(d.ptr(builder, args[2], zero), wide.type.as_pointer()), align=4
        )
        return context.get_dummy_value()

    return types.none(src, dst, row), codegen


@intrinsic
def _narrow_row(typingctx: Any, src: Any, dst: Any, row: Any) -> Any:
    """dst[row, :8] = narrow(src[row, :8]) as one <8 x float> -> <8 x i16> sequence."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        s = Arr2D(context, builder, sig.args[0], args[0])
        d = Arr2D(context, builder, sig.args[1], args[1])
        zero = args[2].type(0)
        f32x8 = ir.VectorType(ir.FloatType(), LANES)
        value = builder.load(
            builder.bitcast(s.ptr(builder, args[2], zero), f32x8.as_pointer()), align=4
        )
        bits = narrow_to_half_bits_portable(builder, value)
        builder.store(
            bits, builder.bitcast(d.ptr(builder, args[2], zero), bits.type.as_pointer()), align=2
        )
        return context.get_dummy_value()

    return types.none(src, dst, row), codegen


@njit(cache=False)
def _widen(bits: np.ndarray, scalar: np.ndarray, vector: np.ndarray) -> None:  # pragma: no cover
    for i in range(bits.shape[0]):
        for j in range(LANES):
            scalar[i, j] = _widen_one(bits[i, j])
        _widen_row(bits, vector, i)


@njit(cache=False)
def _narrow(x: np.ndarray, scalar: np.ndarray, vector: np.ndarray) -> None:  # pragma: no cover
    for i in range(x.shape[0]):
        for j in range(LANES):
            scalar[i, j] = _narrow_one(x[i, j])
        _narrow_row(x, vector, i)


def _same_bits_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = a.ravel(), b.ravel()
    nan = np.isnan(a)
    same = a[~nan].view(np.uint32 if a.dtype == np.float32 else np.uint16)
    other = b[~nan].view(same.dtype)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(same, other))


def test_every_half_widens_exactly_as_numpy_does_scalar_and_vector() -> None:
    bits = np.arange(2**16, dtype=np.uint16).reshape(-1, LANES)
    scalar = np.empty(bits.shape, np.float32)
    vector = np.empty(bits.shape, np.float32)
    _widen(bits, scalar, vector)
    expected = bits.view(np.float16).astype(np.float32)
    assert _same_bits_or_both_nan(scalar, expected)  # -0.0, subnormals and +-inf included
    assert _same_bits_or_both_nan(vector, expected)


def test_float32_narrows_to_the_nearest_half_ties_to_even_scalar_and_vector() -> None:
    rng = np.random.default_rng(0)
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    s = np.sort(np.unique(halves[np.isfinite(halves)]))
    mid = ((s[:-1].astype(np.float64) + s[1:]) / 2).astype(np.float32)  # the ties
    finite_specials = [65504, 65519.99, 65520, 1e6, 3e38, -1e6, 6e-8, 3e-8, 2.9e-8, 1e-10, 1e-40]
    specials = np.array([*finite_specials, -0.0, 0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)
    x = np.concatenate(
        [
            s,
            mid,
            np.nextafter(mid, np.float32(np.inf)),
            np.nextafter(mid, np.float32(-np.inf)),
            specials,
            (rng.standard_normal(200_000) * 300).astype(np.float32),
            rng.integers(0, 2**32, 200_000, dtype=np.uint32).view(np.float32),  # any bits
        ]
    ).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % LANES, np.float32)]).reshape(-1, LANES)
    scalar = np.empty(x.shape, np.uint16)
    vector = np.empty(x.shape, np.uint16)
    _narrow(x, scalar, vector)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(np.float16)
    assert _same_bits_or_both_nan(scalar.view(np.float16), expected)
    assert _same_bits_or_both_nan(vector.view(np.float16), expected)
