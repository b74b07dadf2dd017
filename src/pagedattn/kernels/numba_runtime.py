"""What Numba costs every process beside the kernels' machine code, cut without changing a
kernel or what it computes.

A process that runs the cached kernels paid, on the embedded SmolLM2 (``pagedattn generate``,
``/proc/self/smaps``):

* **the kernels' LLVM IR, parsed and kept**: a kernel loaded from Numba's cache parses its
  bitcode into an LLVM module, to list the symbols it defines and in case a caller compiled
  later inlines it, and keeps it: about 17 MiB each for the fused decode layer and the block
  matmul. Here the symbols come from the object code's ELF symbol table
  (:mod:`pagedattn.kernels.object_symbols`; the same names) and the library keeps the bitcode
  bytes (about 1 MiB), parsed only when a caller is compiled against it
  (:func:`_keep_bitcode`).
* **Numba's runtime, compiled in every process**: the NRT functions (reference counts, the
  allocation hooks) were built from IR through LLVM's optimizer and code generator at each
  start, which maps about 27 MiB of llvmlite's library. Here their object code is cached on
  disk like a kernel's (:func:`_cached_nrt`), keyed by the IR text, the Numba, llvmlite and
  LLVM versions, the target CPU and its features and the optimization level; the first process
  compiles and stores it, a changed key compiles again.
* **SciPy's BLAS, probed at start**: Numba's CPU target imports ``scipy.linalg`` when it
  starts (about 16 MiB and 0.15 s) only to choose how ``np.inner`` compiles. No kernel of the
  package calls NumPy's linear algebra; when a process has not imported ``scipy.linalg``
  itself, the probe is skipped (:func:`_without_blas_probe`): ``np.inner`` in a function
  compiled later runs Numba's own loop, and ``np.dot`` and the ``np.linalg`` functions, which
  check for BLAS when they compile, are unchanged.

These are Numba internals (:mod:`pagedattn.kernels.versions` checks the tested releases). The
engine's model installs them when it is imported (:mod:`pagedattn.model.decoder`), before the
first kernel runs; a process that initialised Numba earlier keeps what it already loaded.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pagedattn.kernels.versions import check_numba_versions

check_numba_versions()  # before any use of Numba's internals below

import llvmlite  # noqa: E402
import numba  # noqa: E402
from llvmlite import binding as ll  # noqa: E402
from numba.core import caching, codegen, config, cpu  # noqa: E402
from numba.core.runtime import nrtdynmod  # noqa: E402

from pagedattn.kernels.object_symbols import defined_symbols  # noqa: E402

NRT_MAGIC = b"pagedattn-nrt-object-1\n"
BLAS_PROBE = "scipy.linalg.cython_blas"  # what numba.np.arraymath imports to probe BLAS


def _unserialize_object(gen: Any, state: tuple[str, str, Any]) -> Any:
    """Numba's ``CPUCodeLibrary._unserialize`` of an object-code entry, with the defined
    symbols read from the object's symbol table instead of the parsed bitcode, which is kept
    as bytes; None where the object's symbols cannot be read (not ELF)."""
    name, _, (object_code, bitcode) = state
    symbols = defined_symbols(object_code)
    if symbols is None:
        return None
    library: Any = gen.create_library(name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._pagedattn_bitcode = bitcode
    library._finalize_final_module()
    library._codegen._engine._defined_symbols |= symbols
    return library


def _keep_bitcode() -> None:
    """A library unserialized from object code keeps its bitcode bytes, never a parsed module
    (parsed only to list its symbols where the object is not ELF, then dropped);
    ``_get_module_for_linking`` parses them when a caller is compiled against it."""
    library = codegen.CPUCodeLibrary
    unserialize: Callable[..., Any] = library._unserialize.__func__  # type: ignore[attr-defined]
    for_linking: Callable[[Any], Any] = library._get_module_for_linking

    def _unserialize(cls: type, gen: Any, state: tuple[str, str, Any]) -> Any:
        if state[1] != "object":  # (name, kind, (object code, bitcode))
            return unserialize(cls, gen, state)
        loaded = _unserialize_object(gen, state)
        if loaded is None:
            loaded = unserialize(cls, gen, state)
            loaded._pagedattn_bitcode = state[2][1]
            loaded._shared_module = None
        return loaded

    def _get_module_for_linking(self: Any) -> Any:
        bitcode = self.__dict__.pop("_pagedattn_bitcode", None)
        if bitcode is not None and self._shared_module is None:
            self._shared_module = ll.parse_bitcode(bitcode)
        return for_linking(self)

    library._unserialize = classmethod(_unserialize)  # type: ignore[assignment]
    library._get_module_for_linking = _get_module_for_linking  # type: ignore[method-assign]


def _cache_anchor() -> None:
    """Numba's cache locators place a function's cache files; the NRT object goes where this
    function's would (the kernels' ``__pycache__``, ``NUMBA_CACHE_DIR``, ...)."""


def nrt_cache_dir() -> Path | None:
    """The writable folder Numba would cache a kernel of this file in, or None."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # type: ignore[attr-defined]
    for locator in impl._locator_classes:
        found = locator.from_function(_cache_anchor, __file__)
        if found is not None:
            return Path(found.get_cache_path())
    return None


def nrt_key(module_text: str, gen: Any) -> str:
    """sha256 of everything the NRT object code depends on."""
    parts = (
        sys.version_info[:2],
        numba.__version__,
        llvmlite.__version__,
        ll.llvm_version_info,
        gen.magic_tuple(),  # triple, CPU name, features
        getattr(config, "OPT", None),
        module_text,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def read_object(path: Path, key: str) -> tuple[bytes, bytes] | None:
    """(object code, bitcode) stored at ``path`` under ``key``, or None when the file is
    missing, unreadable, of another key or damaged (its checksum)."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = NRT_MAGIC + key.encode() + b"\n"
    if not blob.startswith(head) or len(blob) < len(head) + 40:
        return None
    digest, size = blob[len(head) : len(head) + 32], blob[len(head) + 32 : len(head) + 40]
    payload = blob[len(head) + 40 :]
    n = int.from_bytes(size, "little")
    if hashlib.sha256(payload).digest() != digest or n > len(payload):
        return None
    return payload[:n], payload[n:]


def write_object(path: Path, key: str, object_code: bytes, bitcode: bytes) -> None:
    """Store the pair atomically (a temporary file renamed over ``path``); an unwritable
    folder leaves nothing behind."""
    payload = object_code + bitcode
    data = b"".join(
        (
            NRT_MAGIC,
            key.encode(),
            b"\n",
            hashlib.sha256(payload).digest(),
            len(object_code).to_bytes(8, "little"),
            payload,
        )
    )
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)


def _cached_nrt() -> None:
    """Numba's ``compile_nrt_functions``, loading the object code from the cache when it holds
    it for the same key, else compiling it as Numba does and storing it."""

    def compile_nrt_functions(ctx: Any) -> Any:
        ir_module, library = nrtdynmod.create_nrt_module(ctx)  # type: ignore[no-untyped-call]
        gen = ctx.codegen()
        folder = nrt_cache_dir()
        key = nrt_key(str(ir_module), gen)
        path = None if folder is None else folder / f"nrt-{key[:32]}.nbo"
        stored = None if path is None else read_object(path, key)
        if stored is not None:
            return gen.unserialize_library((library.name, "object", stored))
        library.enable_object_caching()
        library.add_ir_module(ir_module)
        library.finalize()
        if path is not None:
            _, _, (object_code, bitcode) = library.serialize_using_object_code()
            write_object(path, key, object_code, bitcode)
        return library

    nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _without_blas_probe() -> None:
    """The CPU target's registries load with ``scipy.linalg.cython_blas`` unimportable, unless
    the process imported it already (then Numba finds BLAS as before)."""
    load: Callable[[Any], None] = cpu.CPUContext.load_additional_registries

    def load_additional_registries(self: Any) -> None:
        skip = BLAS_PROBE not in sys.modules and "numba.np.arraymath" not in sys.modules
        if skip:
            sys.modules[BLAS_PROBE] = None  # type: ignore[assignment]  # import -> ImportError
        try:
            load(self)
        finally:
            if skip and sys.modules.get(BLAS_PROBE, 0) is None:
                del sys.modules[BLAS_PROBE]

    cpu.CPUContext.load_additional_registries = load_additional_registries  # type: ignore[method-assign]


_installed = False


def install() -> None:
    """Install the three savings (see the module docstring); idempotent."""
    global _installed
    if _installed:
        return
    _keep_bitcode()
    _cached_nrt()
    _without_blas_probe()
    _installed = True
