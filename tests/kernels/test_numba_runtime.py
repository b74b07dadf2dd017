"""Numba's per-process memory, cut by kernels/numba_runtime.py: cached kernels keep no parsed IR
(their symbols read from the ELF object instead), the NRT object code is cached on disk, and
the CPU target starts without importing SciPy's BLAS."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as ll
import pytest
from llvmlite import ir
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target

from pagedattn.kernels import numba_runtime
from pagedattn.kernels.object_symbols import defined_symbols

SRC = Path(__file__).resolve().parents[2] / "src"
PREFIX = "pagedattn_test_symbols_"

CALLEE = """
import numba
import numpy as np

@numba.njit(cache=True)
def g(n):
    return np.arange(n).sum()  # allocates: runs Numba's runtime (NRT)
"""
RUN = """
import json, sys
from pagedattn.kernels import numba_runtime
numba_runtime.install()
import numba
from numba.core.runtime.nrt import rtsys
sys.path.insert(0, sys.argv[1])
from callee import g

value = int(g(10))
library = next(iter(g.overloads.values())).library
report = {
    "value": value,
    "loaded": sum(g.stats.cache_hits.values()),
    "parsed_ir_kept": library._shared_module is not None,
    "nrt_from_cache": "_pagedattn_bitcode" in vars(rtsys.library),
    "blas_imported": "scipy.linalg" in sys.modules,
}

@numba.njit
def f(n):  # compiled now, against g's library: its bitcode is parsed for linking
    return g(n) + 1

report["caller"] = int(f(10))
report["parsed_for_linking"] = library._shared_module is not None
print(json.dumps(report))
"""


def _run(folder: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(folder)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_cached_kernel_keeps_no_parsed_ir_and_still_links_into_a_new_caller(
    tmp_path: Path,
) -> None:
    (tmp_path / "callee.py").write_text(CALLEE)
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first["value"] == 45 and first["loaded"] == 0 and first["caller"] == 46
    assert not first["nrt_from_cache"]  # compiled, then stored
    assert len(list(cache.rglob("nrt-*.nbo"))) == 1
    second = _run(tmp_path, cache)
    assert second["value"] == 45 and second["loaded"] == 1  # g from Numba's cache
    assert second["parsed_ir_kept"] is False  # Numba alone keeps g's whole module parsed
    assert second["nrt_from_cache"] is True
    assert second["caller"] == 46 and second["parsed_for_linking"] is True
    assert first["blas_imported"] is False and second["blas_imported"] is False


def test_a_damaged_nrt_object_is_compiled_again_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "callee.py").write_text(CALLEE)
    cache = tmp_path / "cache"
    _run(tmp_path, cache)
    (stored,) = cache.rglob("nrt-*.nbo")
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    again = _run(tmp_path, cache)
    assert again["value"] == 45 and again["caller"] == 46
    assert again["nrt_from_cache"] is False  # refused, compiled
    assert _run(tmp_path, cache)["nrt_from_cache"] is True  # and stored whole again


def test_read_object_returns_what_was_written_under_its_key_only(tmp_path: Path) -> None:
    path = tmp_path / "nrt-x.nbo"
    numba_runtime.write_object(path, "k1", b"\x7fELF object", b"BC bitcode")
    assert numba_runtime.read_object(path, "k1") == (b"\x7fELF object", b"BC bitcode")
    assert numba_runtime.read_object(path, "k2") is None
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    assert numba_runtime.read_object(path, "k1") is None
    assert numba_runtime.read_object(tmp_path / "missing.nbo", "k1") is None
    assert not list(tmp_path.glob("*.tmp"))


def _object_and_bitcode() -> tuple[bytes, bytes]:
    """A library compiled into this process's JIT, with functions and globals of several
    linkages (names prefixed: the JIT's symbols are global) and a call to a function it only
    declares (libc's ``labs``, registered with the JIT under a prefixed name); its ``visible``
    computes ``labs(x) + 7``."""
    labs = ctypes.cast(ctypes.CDLL(None).labs, ctypes.c_void_p).value
    ll.add_symbol(f"{PREFIX}labs", labs)
    module = ir.Module("symbols")
    i64 = ir.IntType(64)
    counter = ir.GlobalVariable(module, i64, f"{PREFIX}counter")  # internal: a local ELF symbol
    counter.linkage = "internal"
    counter.initializer = ir.Constant(i64, 0)
    table = ir.GlobalVariable(module, i64, f"{PREFIX}table")
    table.initializer = ir.Constant(i64, 7)
    helper = ir.Function(module, ir.FunctionType(i64, [i64]), f"{PREFIX}hidden_helper")
    helper.linkage = "internal"
    helper.attributes.add("noinline")
    builder = ir.IRBuilder(helper.append_basic_block())
    total = builder.add(builder.load(counter), helper.args[0])
    builder.store(total, counter)
    builder.ret(total)
    visible = ir.Function(module, ir.FunctionType(i64, [i64]), f"{PREFIX}visible")
    builder = ir.IRBuilder(visible.append_basic_block())
    called = builder.call(helper, [visible.args[0]])
    elsewhere = ir.Function(module, ir.FunctionType(i64, [i64]), f"{PREFIX}labs")
    builder.ret(builder.add(builder.call(elsewhere, [called]), builder.load(table)))
    library = cpu_target.target_context.codegen().create_library("symbols")
    library.enable_object_caching()
    library.add_ir_module(module)
    with global_compiler_lock:
        library.finalize()
    run = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
    assert run(library.get_pointer_to_function(f"{PREFIX}visible"))(-5) == 12  # linked, runs
    _, _, (object_code, bitcode) = library.serialize_using_object_code()
    return object_code, bitcode


@pytest.mark.skipif(sys.platform != "linux", reason="ELF objects: Linux")
def test_the_object_defines_the_symbols_the_bitcode_defines() -> None:
    object_code, bitcode = _object_and_bitcode()
    module = ll.parse_bitcode(bitcode)  # the oracle: what Numba itself would register
    expected = {
        g.name
        for group in (module.functions, module.global_variables)
        for g in group
        if not g.is_declaration
    }
    assert expected == {PREFIX + n for n in ("visible", "table", "hidden_helper", "counter")}
    assert defined_symbols(object_code) == expected


def test_anything_but_a_64_bit_little_endian_elf_gives_none() -> None:
    assert defined_symbols(b"") is None
    assert defined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None  # Mach-O
    assert defined_symbols(b"\x7fELF\x01\x01" + bytes(58)) is None  # 32-bit
    assert defined_symbols(b"\x7fELF\x02\x01" + bytes(10)) is None  # truncated
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[0x28:0x30] = (10**6).to_bytes(8, "little")  # section table past the end
    header[0x3A:0x3E] = (64).to_bytes(2, "little") + (3).to_bytes(2, "little")
    assert defined_symbols(bytes(header)) is None
