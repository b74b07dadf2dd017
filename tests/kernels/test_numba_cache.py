"""Numba's cache is stamped with the package's kernel sources (kernels/numba_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pagedattn.kernels import numba_cache

SRC = Path(__file__).resolve().parents[2] / "src"

CALLER = """
import numba
from pkg.kernels.callee import g

@numba.njit(cache=True)
def f():
    return g() + 1
"""
CALLEE = """
import numba
from pkg.kernels.consts import STEP

@numba.njit(cache=True)
def g():
    return {value} * STEP
"""
RUN = """
import sys
from pathlib import Path
from pagedattn.kernels import numba_cache
numba_cache.install(Path(sys.argv[1]) / "pkg")
from pkg.kernels.caller import f
print(f(), sum(f.stats.cache_hits.values()), numba_cache.compiled_kernels("pkg."))
"""


def _package(tmp_path: Path, value: int, step: int) -> None:
    kernels = tmp_path / "pkg" / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    for name in ("__init__.py", "../__init__.py"):
        (kernels / name).touch()
    (kernels / "caller.py").write_text(CALLER)
    (kernels / "callee.py").write_text(CALLEE.format(value=value))
    (kernels / "consts.py").write_text(f"STEP = {step}\n")


def _run(tmp_path: Path, cache: Path | None = None) -> tuple[int, int, int]:
    cache = tmp_path / "cache" if cache is None else cache
    path = os.pathsep.join([str(tmp_path), str(SRC)])  # this checkout's pagedattn
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    value, hits, misses = done.stdout.split()
    return int(value), int(hits), int(misses)


def test_an_edit_of_a_callee_or_a_constant_recompiles_its_cached_caller(tmp_path: Path) -> None:
    """Numba alone stamps ``f`` with caller.py's mtime and size: after the callee's or the
    constants' edit it would load ``f`` with the old ``g`` compiled in and print 2 again."""
    _package(tmp_path, value=1, step=1)
    assert _run(tmp_path) == (2, 0, 2)  # f and g compiled (compiled_kernels counts both)
    assert _run(tmp_path) == (2, 1, 0)  # f loaded from the cache (with g inside it)
    _package(tmp_path, value=5, step=1)  # the callee changes, caller.py is untouched
    assert _run(tmp_path)[0] == 6
    _package(tmp_path, value=5, step=3)  # a constant the callee reads
    assert _run(tmp_path)[0] == 16
    assert _run(tmp_path) == (16, 1, 0)  # and the new code is cached in turn


def test_a_cache_directory_serves_every_checkout_of_the_same_sources(tmp_path: Path) -> None:
    """Inside NUMBA_CACHE_DIR a kernel's folder is named by its package path, not by a hash
    of the checkout's absolute path: a second checkout (a clean clone elsewhere) loads what
    the first compiled, and one with other sources compiles its own."""
    cache = tmp_path / "cache"
    for name in ("first", "second"):
        _package(tmp_path / name, value=1, step=1)
    assert _run(tmp_path / "first", cache) == (2, 0, 2)
    assert _run(tmp_path / "second", cache) == (2, 1, 0)
    assert "pkg-kernels" in {p.name for p in cache.iterdir()}
    _package(tmp_path / "second", value=5, step=1)
    assert _run(tmp_path / "second", cache)[0] == 6


def test_the_stamp_covers_what_the_kernel_imports_and_not_other_files(tmp_path: Path) -> None:
    """caller.py imports callee.py, which imports consts.py: an edit of either changes the
    caller's stamp; a sibling no kernel imports (like a tokenizer) and a file of another folder
    do not."""
    _package(tmp_path, value=1, step=1)
    root = tmp_path / "pkg"
    caller = str(root / "kernels" / "caller.py")
    (root / "kernels" / "tokenizer.py").write_text("x = 1\n")
    (root / "server.py").write_text("x = 1\n")

    def stamp() -> str | None:
        numba_cache.compiled_sources.cache_clear()
        return numba_cache.source_stamp(caller, root)

    before = stamp()
    sources = numba_cache.compiled_sources(root / "kernels" / "caller.py", root)
    assert {p.name for p in sources} == {"caller.py", "callee.py", "consts.py"}
    (root / "kernels" / "consts.py").write_text("STEP = 2\n")
    after_consts = stamp()
    assert after_consts != before
    (root / "kernels" / "tokenizer.py").write_text("x = 2\n")
    (root / "server.py").write_text("x = 2\n")
    assert stamp() == after_consts
    assert numba_cache.source_stamp(__file__, root) is None  # outside the package: Numba's


def test_editing_the_tokenizer_or_the_engine_leaves_every_kernel_of_the_package_cached() -> None:
    """The package's kernel modules reach the compiled code of kernels/ and model/ through
    their imports, never the tokenizer, the loaders, the engine or the server."""
    root = numba_cache.PACKAGE_ROOT
    kernel_modules = [
        root / "model" / name
        for name in ("decode_layer.py", "quantized.py", "row_ops.py", "block_dot_int8.py")
    ] + sorted((root / "kernels").glob("*.py"))
    reached = {p for m in kernel_modules for p in numba_cache.compiled_sources(m.resolve(), root)}
    names = {p.relative_to(root).as_posix() for p in reached}
    assert {"kernels/paged_decode_numba.py", "model/block_dot.py", "model/block_ir.py"} <= names
    for unrelated in ("model/tokenizer.py", "model/gguf_loader.py", "model/llama.py"):
        assert unrelated not in names
    assert not any(n.startswith(("engine/", "server/", "cli/")) for n in names), names


def test_every_cached_kernel_of_the_package_is_stamped() -> None:
    """install() runs before any kernel is decorated (pagedattn.kernels imports it first)."""
    from numba.core.registry import CPUDispatcher

    import pagedattn.bench.kernels
    import pagedattn.model.decode_layer
    import pagedattn.model.quantized  # noqa: F401

    found = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("pagedattn."):
            continue
        for obj in vars(module).values():
            if isinstance(obj, CPUDispatcher) and obj._cache.__class__.__name__ != "NullCache":
                locator = obj._cache._impl._locator
                assert type(locator).__name__.startswith("Stamped"), (name, obj.__name__)
                found += 1
    assert found >= 40


def test_the_import_scan_finds_every_import_statement_of_the_package() -> None:
    """The stamp's line scan finds the statements a full parse of each file finds (Python's
    own ``ast.walk``), in every module of the package, lazy and parenthesised ones included."""
    import ast

    for path in sorted(numba_cache.PACKAGE_ROOT.rglob("*.py")):
        source = path.read_bytes()
        oracle = [
            ast.dump(n)
            for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        scanned = [ast.dump(n) for n in numba_cache._import_statements(source)]
        assert sorted(scanned) == sorted(oracle), path


def test_the_import_scan_reads_continued_statements_and_skips_prose() -> None:
    source = (
        b'"""Docs.\n\nfrom the start of a line, import this prose\n"""\n'
        b"import os, sys\n"
        b"if True:\n"
        b"    from a.b import (\n"
        b"  c,\n"
        b"        d,\n"
        b"    )\n"
        b"    from . import e \\\n"
        b"        as f\n"
    )
    found = [ast_names(n) for n in numba_cache._import_statements(source)]
    assert found == [["os", "sys"], ["a.b", "c", "d"], [".", "e"]]


def ast_names(node: object) -> list[str]:
    import ast

    assert isinstance(node, ast.Import | ast.ImportFrom)
    module = [] if isinstance(node, ast.Import) else ["." * node.level + (node.module or "")]
    return module + [a.name for a in node.names]
