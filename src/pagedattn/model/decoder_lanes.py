"""Register pieces the block decoders share: the decoder protocol, the ``vpermps`` table
look-up of 4-bit codes, and float lanes handed out as splats (:class:`Lanes`)."""

from __future__ import annotations

from typing import Protocol

from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.simd_ir import F32, I8, I32, mask, splat
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.block_ir import LANES, VF

V16I32 = ir.VectorType(I32, LANES)


class Decoder(Protocol):
    """The float32 weights of one block: ``groups`` groups of GROUP inputs."""

    groups: int

    def group(self, g: int) -> list[ir.Value]:
        """Inputs ``[GROUP * g, GROUP * (g + 1))`` of the block as GROUP // LANES vectors."""
        ...


def ints(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def looked_up(builder: ir.IRBuilder, table: ir.Value, index: ir.Value) -> ir.Value:
    """``table[index & 15]`` per lane (``vpermps`` on zmm: AVX-512F only)."""
    fnty = ir.FunctionType(VF, [VF, V16I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.permvar.sf.512")
    return builder.call(fn, [table, index])


CODES16 = ir.Constant(VF, [float(q) for q in range(LANES)])


def nibbles_looked_up(builder: ir.IRBuilder, table: ir.Value, codes: ir.Value) -> list[ir.Value]:
    """The 32 weights of 16 code bytes at ``codes`` (i8*; byte j: input j in the low nibble,
    input 16 + j in the high), each ``table[code]`` (:func:`looked_up`, which reads an index's
    low 4 bits only, so the low nibbles need no mask)."""
    raw = builder.load(builder.bitcast(codes, ir.VectorType(I8, LANES).as_pointer()), align=1)
    low = builder.zext(raw, V16I32)
    high = builder.lshr(low, ints([4] * LANES))
    return [looked_up(builder, table, low), looked_up(builder, table, high)]


class Lanes:
    """The lanes of float vectors, each handed out splatted to LANES lanes.

    With AVX-512 the vectors go through a stack slot that LLVM may not see into (an empty asm
    statement takes its address), so each splat is a broadcast load, or an fma's embedded
    ``{1to16}`` operand, instead of one or two shuffles per lane in registers; elsewhere, or
    as a fallback, a shuffle. Either way the same float values: speed only."""

    def __init__(self, builder: ir.IRBuilder, vectors: list[ir.Value]) -> None:
        self._builder, self._vectors = builder, vectors
        self._slot: ir.Value | None = None
        if has_wide_registers():
            count = sum(v.type.count for v in vectors)
            slot = cgutils.alloca_once(builder, ir.ArrayType(F32, count))
            at = 0
            for v in vectors:
                ptr = builder.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, at)])
                builder.store(v, builder.bitcast(ptr, v.type.as_pointer()), align=4)
                at += v.type.count
            hide(builder, slot)
            self._slot = slot

    def splat(self, i: int) -> ir.Value:
        """Lane ``i`` of the vectors laid end to end, as <LANES x float>."""
        b = self._builder
        if self._slot is None:
            for v in self._vectors:
                if i < v.type.count:
                    return b.shuffle_vector(v, v, mask([i] * LANES))
                i -= v.type.count
            raise IndexError(i)
        ptr = b.gep(self._slot, [ir.Constant(I32, 0), ir.Constant(I32, i)])
        return splat(b, b.load(ptr, align=4), LANES)


def hide(builder: ir.IRBuilder, slot: ir.Value) -> None:
    """An empty asm statement that takes ``slot``'s address, so LLVM keeps it in memory."""
    i8p = I8.as_pointer()
    barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i8p]), "", "r,~{memory}",
                           side_effect=True)  # fmt: skip
    builder.call(barrier, [builder.bitcast(slot, i8p)])
