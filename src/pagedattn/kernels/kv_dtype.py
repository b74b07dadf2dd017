"""The KV pool's storage dtype as the Numba kernels see it: float32, float16 held as uint16, or
int8 codes with a float32 scale per row (:mod:`pagedattn.kernels.kv_int8`).

The kernels always compute in float32. A float16 pool (half the bytes of float32, the default of
llama.cpp's KV cache, ``--cache-type-k f16``) halves what a decode step streams from memory;
keys and values are rounded to nearest-even when written and widened exactly when read.

Numba has no float16 type, so a float16 pool reaches the kernels as its uint16 bits
(:func:`kernel_cache`), and two intrinsics convert (:mod:`pagedattn.kernels.half_ir`): on x86
with F16C (every AVX2 CPU) and on aarch64 the ``vcvtph2ps`` / ``vcvtps2ph`` (``fcvt``)
instructions, vectorised like any other load; on other CPUs an exact integer sequence with the
same results. Inside a kernel, :func:`load_f32` widens one
element of either kind of pool and :func:`store_as` narrows a float32 to the element type of a
given pool, so one kernel source serves every dtype (Numba compiles one specialisation each).
An int8 pool's last axis is ``head_dim + 4`` (:func:`pool_row_width`); :func:`load_f32` widens
its codes and :func:`~pagedattn.kernels.kv_int8.row_scale` reads a row's scale, which the
kernels fold into scores and softmax weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

from pagedattn.kernels.half_ir import narrow_to_half_bits, widen_half_bits
from pagedattn.kernels.kv_int8 import INT8, SCALE_BYTES

_F16 = np.dtype(np.float16)
POOL_DTYPES = (np.dtype(np.float32), _F16, INT8)  # what a KV pool may hold, float32 first


def pool_row_width(dtype: np.dtype | str, head_dim: int) -> int:
    """Elements of one (token, KV head) row of a pool of ``dtype``: ``head_dim``, and for int8
    its codes plus the float32 scale's 4 bytes.

    Raises:
        ValueError: int8 with a head_dim that is not a multiple of 4.
    """
    if np.dtype(dtype) != INT8:
        return head_dim
    if head_dim % SCALE_BYTES:
        raise ValueError(f"kv_cache_dtype int8: head_dim must be a multiple of 4, got {head_dim}")
    return head_dim + SCALE_BYTES


def pool_head_dim(dtype: np.dtype, row_width: int) -> int:
    """head_dim of a pool whose rows hold ``row_width`` elements of ``dtype``."""
    return row_width - SCALE_BYTES if dtype == INT8 else row_width


def logical_shape(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """``shape`` of a pool (or page) of ``dtype`` with its last axis as head_dim."""
    return (*shape[:-1], pool_head_dim(dtype, shape[-1]))


def kernel_cache(cache: np.ndarray) -> np.ndarray:
    """The array a Numba kernel takes for a validated pool view: float32 as is, float16 as its
    uint16 bits (the same memory, no copy)."""
    return cache.view(np.uint16) if cache.dtype == _F16 else cache


@intrinsic
def _half_bits_to_f32(typingctx: Any, bits: types.Type) -> Any:
    """float32 value of the IEEE half whose bits are ``bits`` (uint16): exact."""
    if bits != types.uint16:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return widen_half_bits(builder, args[0])

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_to_half_bits(typingctx: Any, value: types.Type) -> Any:
    """Bits (uint16) of ``value`` (float32) rounded to the nearest IEEE half, ties to even;
    beyond the half range +-inf, NaN stays NaN."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return narrow_to_half_bits(builder, args[0])

    return types.uint16(types.float32), codegen


def load_f32(element: Any) -> Any:  # pragma: no cover - replaced by the overload in kernels
    """float32 value of one pool element (float32 as is, uint16 = float16 bits widened, int8 =
    the code, before its row's scale)."""
    raise NotImplementedError("load_f32 is only callable from Numba kernels")


def store_as(value: Any, cache: Any) -> Any:  # pragma: no cover - replaced by the overload
    """``value`` (float32) as an element of ``cache``'s dtype (uint16: float16 bits)."""
    raise NotImplementedError("store_as is only callable from Numba kernels")


# The overloads' parameters carry no annotations: Numba requires the typing function's
# signature to equal its implementations' (the lambdas), annotations included.
@overload(load_f32, inline="always")
def _load_f32(element):  # type: ignore[no-untyped-def]
    if element == types.float32:
        return lambda element: element
    if element == types.uint16:
        return lambda element: _half_bits_to_f32(element)  # type: ignore[call-arg]
    if element == types.int8:
        return lambda element: np.float32(element)
    raise TypingError(
        f"load_f32: a KV pool holds float32, uint16 (float16 bits) or int8, got {element}"
    )


@overload(store_as, inline="always")
def _store_as(value, cache):  # type: ignore[no-untyped-def]
    dtype = getattr(cache, "dtype", None)
    if dtype == types.float32:
        return lambda value, cache: np.float32(value)
    if dtype == types.uint16:
        return lambda value, cache: _f32_to_half_bits(np.float32(value))  # type: ignore[call-arg]
    raise TypingError(f"store_as: a KV pool holds float32 or uint16 (float16 bits), got {cache}")
