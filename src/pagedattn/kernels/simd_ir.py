"""Building blocks for kernels written as LLVM vector IR through Numba intrinsics.

A kernel built from these fixes the order of every floating-point operation itself (``llvm.fma``
and plain ``fadd`` on ``<N x float>``, no fast-math flags), so LLVM chooses instructions and
registers but never the rounding: the same bits whichever CPU (AVX2 splits a 16-lane vector
into two ymm, AVX-512 keeps one zmm) and whether Numba compiled the kernel or loaded it from its
cache. Used by the quantized matmuls (``model/block_dot.py``) and the prefill attention's
register tiles (``kernels/lane_tiles.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba.core import cgutils

F32 = ir.FloatType()
I8 = ir.IntType(8)
I32 = ir.IntType(32)


def mask(indices: range | list[int]) -> ir.Constant:
    """A shufflevector mask of ``indices``."""
    return ir.Constant(ir.VectorType(I32, len(indices)), list(indices))


def splat(builder: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    """<lanes x T> of the scalar ``value`` of type T (a float32, an integer)."""
    one = builder.insert_element(
        ir.Constant(ir.VectorType(value.type, 1), ir.Undefined), value, I32(0)
    )
    return builder.shuffle_vector(one, one, mask([0] * lanes))


def fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c, rounded once (``llvm.fma``), on float32 scalars or vectors."""
    ty = a.type
    name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
    return builder.call(fn, [a, b, c])


def prefetch(builder: ir.IRBuilder, ptr: ir.Value, locality: int = 1) -> None:
    """Hint the cache line at ``ptr`` into cache (``llvm.prefetch``; never faults): locality 3
    into L1 (x86 ``prefetcht0``), 2 into L2 (``prefetcht1``), 1 ``prefetcht2`` (L2 / L3).

    The default is 1: a prefetch into L1 holds one of L1's few miss buffers until its line
    arrives from memory, so a kernel streaming weights from memory can have only that many
    lines in flight. Every block matrix of Qwen2.5-1.5B once against one activation row, one
    Zen 4 core, from memory: int8 activations 75 ms with ``prefetcht0``, 61 ms with
    ``prefetcht2`` (Q6_K 25 -> 19 ms); the exact path 92 -> 87 ms."""
    i8p = I8.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, i8p), I32(0), I32(locality), I32(1)])


def hsum(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The lanes of float vector ``v`` summed by halving: lane i += lane i + width/2 until one
    is left (plain, ordered fadds)."""
    width = v.type.count
    while width > 1:
        width //= 2
        v = builder.fadd(
            builder.shuffle_vector(v, v, mask(range(width))),
            builder.shuffle_vector(v, v, mask(range(width, 2 * width))),
        )
    return builder.extract_element(v, I32(0))


def load_vector(builder: ir.IRBuilder, ptr: ir.Value, lanes: int) -> ir.Value:
    """<lanes x float> from float32 ``ptr`` (unaligned)."""
    return builder.load(builder.bitcast(ptr, ir.VectorType(F32, lanes).as_pointer()), align=4)


def store_vector(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    """Store float vector ``value`` at float32 ``ptr`` (unaligned)."""
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=4)


class Arr2D:
    """Data pointer and row stride (in elements) of a C-contiguous-rows 2-D Numba array."""

    def __init__(self, context: Any, builder: ir.IRBuilder, ty: Any, value: ir.Value) -> None:
        arr = context.make_array(ty)(context, builder, value)
        self.data = arr.data
        itemsize = context.get_abi_sizeof(context.get_data_type(ty.dtype))
        stride = cgutils.unpack_tuple(builder, arr.strides, 2)[0]
        self.row_stride = builder.sdiv(stride, stride.type(itemsize))
        self.shape = cgutils.unpack_tuple(builder, arr.shape, 2)

    def ptr(self, builder: ir.IRBuilder, row: ir.Value, col: ir.Value) -> ir.Value:
        return builder.gep(self.data, [builder.add(builder.mul(row, self.row_stride), col)])


def carried_loop(
    builder: ir.IRBuilder,
    count: ir.Value,
    carried: list[ir.Value],
    body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]],
) -> None:
    """for i in range(count): carried = body(i, carried), the values kept in allocas (SROA turns
    them into registers); ``carried`` holds the final values afterwards."""
    slots = [cgutils.alloca_once_value(builder, a) for a in carried]
    with cgutils.for_range(builder, count) as loop:
        new = body(loop.index, [builder.load(s) for s in slots])
        for s, v in zip(slots, new, strict=True):
            builder.store(v, s)
    carried[:] = [builder.load(s) for s in slots]
