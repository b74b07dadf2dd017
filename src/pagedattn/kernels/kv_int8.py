"""int8 KV pages: one int8 code per element plus one float32 scale per (token, KV head) row.

A row of an int8 pool is ``head_dim + 4`` bytes: the codes ``c[0 .. head_dim)`` then the row's
float32 scale ``s`` in its last 4 bytes (native byte order; ``head_dim`` a multiple of 4, so a
float32 view of the pool reads it aligned). The row's value is ``s * c`` (widened exactly to
float32: ``float32(c) * s``). A page stays one array, so reading, writing, copying and storing
pages is the same as for float pools, and a page holds (head_dim + 4) / (2 head_dim) of a
float16 page's bytes (0.53 at head_dim 64).

Quantization is symmetric per row: ``s = absmax / 127`` (float32), ``c = rint(x / s)`` (round
to nearest, ties to even), clamped to [-127, 127]; a row of zeros gets ``s = 0`` and codes 0.

Why one scale per row and not ggml's q8_0 (a float16 scale per block of 32 values): the decode
and prefill kernels fold a row scale into the score (``q . (s c) = s (q . c)``) and into the
softmax weight of a value row (``p s``), so their inner products stay pure code products with
one multiply per row; a per-32 scale would need a multiply per block inside them. At head_dim
64 both cost 4 bytes a row. q8_0 blocks are more accurate: on SmolLM2-135M's K/V of a 400-token
prompt, relative RMS error K 0.84 % against 1.10 % per row, V 0.58 % against 0.66 %; per row,
greedy tokens still equalled the float32 cache's on the prompts tested (README, int8 KV). The
per-32 kernel's speed was not measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

INT8 = np.dtype(np.int8)
SCALE_BYTES = 4  # one float32 scale at the end of each (token, KV head) row
CODE_MAX = 127


def is_int8_pool(ty: Any) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 4 and ty.dtype == types.int8


def _scale_pointer(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
    """float* to the scale of row ``cache[page, g, t]`` (args: cache, page, g, t)."""
    arr = context.make_array(sig.args[0])(context, builder, args[0])
    shape = cgutils.unpack_tuple(builder, arr.shape, 4)
    strides = cgutils.unpack_tuple(builder, arr.strides, 4)
    page, g, t = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 2, 3))
    code_end = builder.sub(shape[3], shape[3].type(SCALE_BYTES))
    offset = builder.add(
        builder.add(builder.mul(page, strides[0]), builder.mul(g, strides[1])),
        builder.add(builder.mul(t, strides[2]), builder.mul(code_end, strides[3])),
    )
    return builder.bitcast(builder.gep(arr.data, [offset]), ir.FloatType().as_pointer())


@intrinsic
def load_scale(typingctx: Any, cache: Any, page: Any, g: Any, t: Any) -> Any:
    """float32 scale of row ``cache[page, g, t]`` of an int8 pool."""
    if not is_int8_pool(cache):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.load(_scale_pointer(context, builder, signature, args), align=4)

    return types.float32(cache, page, g, t), codegen


@intrinsic
def store_scale(typingctx: Any, cache: Any, page: Any, g: Any, t: Any, value: Any) -> Any:
    """Set the float32 scale of row ``cache[page, g, t]`` of an int8 pool to ``value``."""
    if not is_int8_pool(cache) or value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.store(args[4], _scale_pointer(context, builder, signature, args), align=4)
        return context.get_dummy_value()

    return types.none(cache, page, g, t, value), codegen


def row_scale(cache: Any, page: Any, g: Any, t: Any) -> Any:  # pragma: no cover - overloaded
    """Scale of row ``cache[page, g, t]``: an int8 pool's float32 scale, 1 for float pools."""
    raise NotImplementedError("row_scale is only callable from Numba kernels")


def cache_head_dim(cache: Any) -> Any:  # pragma: no cover - overloaded
    """head_dim of a 4-D pool view: its last axis, less the scale bytes of an int8 pool."""
    raise NotImplementedError("cache_head_dim is only callable from Numba kernels")


# The overloads' parameters carry no annotations: Numba requires the typing function's
# signature to equal its implementations' (the lambdas), annotations included.
@overload(row_scale, inline="always")
def _row_scale(cache, page, g, t):  # type: ignore[no-untyped-def]
    if is_int8_pool(cache):
        return lambda cache, page, g, t: load_scale(cache, page, g, t)  # type: ignore[call-arg]
    if getattr(cache, "dtype", None) in (types.float32, types.uint16):
        return lambda cache, page, g, t: np.float32(1.0)
    raise TypingError(f"row_scale: a KV pool holds float32, uint16 or int8, got {cache}")


@overload(cache_head_dim, inline="always")
def _cache_head_dim(cache):  # type: ignore[no-untyped-def]
    if is_int8_pool(cache):
        return lambda cache: cache.shape[3] - SCALE_BYTES
    return lambda cache: cache.shape[3]
