"""The CPU Numba compiles for, and what it can do, asked of LLVM itself.

Numba builds its target machine from ``NUMBA_CPU_NAME`` (default: the host's CPU) and
``NUMBA_CPU_FEATURES`` (default: the host's feature list; empty for ``generic``, the baseline
of the architecture). A kernel that names an instruction the target lacks does not fail with a
Python error: LLVM stops the process (``LLVM ERROR: Cannot select``), and a float16 conversion
without hardware support calls a runtime routine (``__extendhfsf2``) that nothing links. So
every host-specific piece of IR is chosen here, before it is emitted, from the answers of a
target machine built exactly as Numba builds its own: LLVM compiles a tiny probe function and
the assembly it prints says whether the instruction exists. The answers depend only on the
target, and Numba's cache index is keyed by the same target (name and features), so a cached
kernel is never reused for a CPU it was not compiled for.
"""

from __future__ import annotations

import functools
import re

from llvmlite import binding as ll
from llvmlite import ir
from numba.core import config
from numba.core.codegen import get_host_cpu_features


@functools.cache
def target_cpu() -> tuple[str, str]:
    """``(cpu name, feature string)`` of the target machine Numba compiles for (Numba reads
    its configuration once, at import)."""
    name: str | None = getattr(config, "CPU_NAME", None)
    features: str | None = getattr(config, "CPU_FEATURES", None)
    return name or ll.get_host_cpu_name(), get_host_cpu_features() if features is None else features


@functools.cache
def _assembly(module_text: str, cpu: str, features: str) -> str:
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    machine = ll.Target.from_default_triple().create_target_machine(cpu=cpu, features=features)
    module = ll.parse_assembly(module_text)
    module.triple = machine.triple
    return str(machine.emit_assembly(module))


def _probe(build: ir.Function) -> str:
    """Assembly of ``build``'s module for the current target."""
    return _assembly(str(build.module), *target_cpu())


def _vector_function(name: str, a: ir.Type, b: ir.Type) -> tuple[ir.Function, ir.IRBuilder]:
    """``void name(a* , b*)`` and a builder at its entry."""
    module = ir.Module(name=name)
    function = ir.Function(
        module, ir.FunctionType(ir.VoidType(), [a.as_pointer(), b.as_pointer()]), name
    )
    builder = ir.IRBuilder(function.append_basic_block())
    return function, builder


def is_x86() -> bool:
    return bool(ll.Target.from_default_triple().name.startswith("x86"))


@functools.cache
def native_half_conversion() -> bool:
    """True when the target converts float16 <-> float32 in hardware (F16C on x86, every
    aarch64): LLVM's ``fpext`` / ``fptrunc`` on ``half`` then need no runtime routine."""
    i16x8, f32x8 = ir.VectorType(ir.IntType(16), 8), ir.VectorType(ir.FloatType(), 8)
    function, builder = _vector_function("half_probe", i16x8, f32x8)
    bits_ptr, float_ptr = function.args
    half = ir.VectorType(ir.HalfType(), 8)
    builder.store(builder.fpext(builder.bitcast(builder.load(bits_ptr), half), f32x8), float_ptr)
    narrow = builder.fptrunc(builder.load(float_ptr), half)
    builder.store(builder.bitcast(narrow, i16x8), bits_ptr)
    builder.ret_void()
    asm = _probe(function)
    return bool("hfsf2" not in asm and "sfhf2" not in asm)


@functools.cache
def has_avx2() -> bool:
    """True when the target is x86 with AVX2 (256-bit integer vectors: one ``vpaddd`` on ymm
    registers where AVX alone splits the add in two xmm halves)."""
    if not is_x86():
        return False
    i32x8 = ir.VectorType(ir.IntType(32), 8)
    function, builder = _vector_function("avx2_probe", i32x8, i32x8)
    a, b = function.args
    builder.store(builder.add(builder.load(a), builder.load(b)), a)
    builder.ret_void()
    return re.search(r"vpaddd\s+[^\n]*%ymm", _probe(function)) is not None


def _pairwise_madd_then_add(lanes: int) -> str:
    """Assembly of ``acc + pmaddwd(a, b)`` on ``lanes`` int32 lanes, written as plain IR
    (sign-extend, multiply, add the even and odd products): LLVM folds it into one VNNI
    ``vpdpwssd`` where the target has VNNI at that width, and never names an instruction the
    target lacks, so the probe itself is safe on every CPU."""
    i16s, i32s = ir.VectorType(ir.IntType(16), 2 * lanes), ir.VectorType(ir.IntType(32), lanes)
    function, builder = _vector_function(f"vnni_probe_{lanes}", i16s, i32s)
    pairs_ptr, acc_ptr = function.args
    wide = ir.VectorType(ir.IntType(32), 2 * lanes)
    a = builder.sext(builder.load(pairs_ptr), wide)
    b = builder.sext(builder.load(builder.gep(pairs_ptr, [ir.IntType(64)(1)])), wide)
    products = builder.mul(a, b)
    even, odd = (
        builder.shuffle_vector(
            products, products, ir.Constant(i32s, list(range(start, 2 * lanes, 2)))
        )
        for start in (0, 1)
    )
    builder.store(builder.add(builder.add(even, odd), builder.load(acc_ptr)), acc_ptr)
    builder.ret_void()
    return _probe(function)


@functools.cache
def has_vnni_256() -> bool:
    """True when the target has VNNI on ymm registers (``vpdpbusd``: AVX512_VNNI with
    AVX512VL, or AVX-VNNI): asked of LLVM through :func:`_pairwise_madd_then_add`."""
    if not has_avx2():
        return False
    return re.search(r"vpdpwssd\s+[^\n]*%ymm", _pairwise_madd_then_add(8)) is not None


@functools.cache
def has_avx512bw() -> bool:
    """True when the target adds 64 bytes in one zmm register (``vpaddb``: AVX512BW), so
    512-bit byte and word vectors stay whole."""
    if not has_avx2():
        return False
    i8x64 = ir.VectorType(ir.IntType(8), 64)
    function, builder = _vector_function("avx512bw_probe", i8x64, i8x64)
    a, b = function.args
    builder.store(builder.add(builder.load(a), builder.load(b)), a)
    builder.ret_void()
    return re.search(r"vpaddb\s+[^\n]*%zmm", _probe(function)) is not None


@functools.cache
def has_vnni_512() -> bool:
    """True when the target has AVX512_VNNI on zmm registers (``vpdpbusd`` on 64 bytes)."""
    if not has_avx512bw():
        return False
    return re.search(r"vpdpwssd\s+[^\n]*%zmm", _pairwise_madd_then_add(16)) is not None


@functools.cache
def has_wide_registers() -> bool:
    """True when the target has 32 vector registers of 512 bits (x86 AVX-512F): a kernel may
    keep about twice as many 16-lane accumulators live as on AVX2's 16 ymm registers, where
    each 16-lane vector takes two."""
    return is_x86() and "+avx512f" in target_cpu()[1].split(",")
