"""Numba's on-disk cache, made safe against edits of a kernel's callees and constants.

Numba stamps a cached kernel with its own source file's modification time and size only
(``numba.core.caching._SourceFileBackedLocatorMixin``). Our kernels call, and are compiled
together with, kernels and constants of other files (``decode_layer`` inlines the decode
attention of ``paged_decode_numba``, which reads ``numba_consts``): after an edit of a callee, a
process that loads the caller from the cache runs the callee's old code, silently.

Importing this module calls :func:`install`, which replaces each of Numba's cache locators by
a subclass whose stamp for a file of this package is a hash of that file and of every file of
the package it imports, directly or through others (:func:`compiled_sources`; imports anywhere
in a module, lazy ones inside functions included). A kernel can only call, inline or read what
its module reaches through imports, so an edit of any of those recompiles it, and an edit of
a file none of them imports (a tokenizer, the server) recompiles nothing. Files outside the
package keep Numba's own stamp. Where a kernel's cache files go (``__pycache__`` beside the
source, ``NUMBA_CACHE_DIR``, the user-wide directory) is Numba's choice, as before; inside a
cache directory their folder is named by the package path (``pagedattn-model``), not by a hash
of the checkout's absolute path, so one cache directory serves every checkout of the same
sources (the stamp keeps other sources' entries out).

This module and :mod:`pagedattn.kernels.gomp` use Numba internals (its cache locators, its
thread-pool launch), so importing it first checks that Numba and llvmlite are versions these
were tested with (:data:`TESTED`), and refuses others with one clear error.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
from pathlib import Path
from typing import Any

from pagedattn.kernels.versions import check_numba_versions

check_numba_versions()  # before any use of Numba's internals below

from numba.core import caching  # noqa: E402  (after the version check)

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # src/pagedattn


# where an import statement may start: at the start of a line, indented or not (the package
# is formatted code, one statement per line); a match inside a string fails to parse alone
_IMPORT_START = re.compile(rb"^[ \t]*(?:from[ \t]+[.\w]+[ \t]+import\b|import[ \t]+\w)", re.M)


def _statement_end(source: bytes, at: int) -> int:
    """The end of the import statement whose text continues at ``at``: its line, or past the
    closing parenthesis of a parenthesised name list, or past backslash continuations."""
    end = source.find(b"\n", at)
    end = len(source) if end < 0 else end
    if b"(" in source[at:end] and b")" not in source[at:end]:
        close = source.find(b")", end)
        return len(source) if close < 0 else close + 1
    while end > 0 and source[end - 1 : end] == b"\\":
        nxt = source.find(b"\n", end + 1)
        end = len(source) if nxt < 0 else nxt
    return end


def _import_statements(source: bytes) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``source``, nested ones included (in functions, classes,
    ``if`` / ``try`` / ``with`` bodies): each line that starts like one is parsed alone, a
    fraction of the time of parsing the whole file."""
    found: list[ast.Import | ast.ImportFrom] = []
    for match in _IMPORT_START.finditer(source):
        text = source[match.start() : _statement_end(source, match.end())]
        try:
            tree = ast.parse(text.decode().lstrip())  # continuation lines: any indent
        except (SyntaxError, UnicodeDecodeError):  # text in a string, not a statement
            continue
        found.extend(n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))
    return found


def _imported_modules(source: bytes, module: str) -> set[str]:
    """Dotted names ``source`` (of module ``module``) imports, with every
    ``from a import b`` as both ``a`` and ``a.b`` (``b`` may be a module or a name)."""
    names: set[str] = set()
    for node in _import_statements(source):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        else:
            base = node.module or ""
            if node.level:  # relative: from the importing module's package upwards
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _module_file(name: str, root: Path) -> Path | None:
    """The file of module ``name`` inside package ``root`` (named ``root.name``), or None."""
    parts = name.split(".")
    if parts[0] != root.name:
        return None
    for candidate in (root.joinpath(*parts[1:]).with_suffix(".py"),
                      root.joinpath(*parts[1:], "__init__.py")):  # fmt: skip
        if len(parts) > 1 and candidate.is_file():
            return candidate
    return root / "__init__.py" if len(parts) == 1 else None


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join([root.name, *(parts[:-1] if parts[-1] == "__init__" else parts)])


@functools.cache
def _direct_sources(path: Path, root: Path, version: tuple[int, int]) -> frozenset[Path]:
    """The files of package ``root`` that ``path`` imports itself (each version of a file,
    its modification time and size, parsed once)."""
    names = _imported_modules(path.read_bytes(), _module_name(path, root))
    found = (_module_file(n, root) for n in names)
    return frozenset(f for f in found if f is not None)


@functools.cache
def compiled_sources(path: Path, root: Path = PACKAGE_ROOT) -> tuple[Path, ...]:
    """``path`` and every file of package ``root`` it imports, directly or through the files
    it imports (sorted): what a kernel defined in ``path`` may be compiled together with."""
    seen = {path}
    todo = [path]
    while todo:
        current = todo.pop()
        stat = current.stat()
        for found in _direct_sources(current, root, (stat.st_mtime_ns, stat.st_size)) - seen:
            seen.add(found)
            todo.append(found)
    return tuple(sorted(seen))


def source_stamp(py_file: str, root: Path = PACKAGE_ROOT) -> str | None:
    """The cache stamp of a kernel defined in ``py_file``: sha256 over the relative path and
    bytes of each of its :func:`compiled_sources`, or None for a file outside ``root`` (Numba's
    own stamp)."""
    path = Path(py_file).resolve()
    if not path.is_relative_to(root):
        return None
    try:
        digest = hashlib.sha256()
        for source in compiled_sources(path, root):
            digest.update(source.relative_to(root).as_posix().encode())
            digest.update(source.read_bytes())
    except OSError:  # not a plain file (a zipped package): Numba's own stamp
        return None
    return digest.hexdigest()


def cache_subpath(py_file: str, root: Path = PACKAGE_ROOT) -> str | None:
    """The folder, inside a cache directory, of the kernels of ``py_file`` under ``root``:
    its folder relative to ``root``'s parent (``pagedattn-model``), the same in every checkout
    or install of the package, or None for a file outside ``root`` (Numba's own subpath, a
    hash of the absolute folder)."""
    path = Path(py_file).resolve()
    if not path.is_relative_to(root):
        return None
    return "-".join(path.parent.relative_to(root.parent).parts)


def _stamped(locator: type[Any], root: Path) -> type[Any]:
    """``locator`` whose source stamp is :func:`source_stamp` and whose folder inside a cache
    directory (``NUMBA_CACHE_DIR``, the user-wide one) is :func:`cache_subpath` for files under
    ``root``: entries are found by what they were compiled from, wherever the checkout is."""

    def get_source_stamp(self: Any) -> Any:
        stamp = source_stamp(self._py_file, root)
        return locator.get_source_stamp(self) if stamp is None else stamp

    def get_suitable_cache_subpath(cls: Any, py_file: str) -> str:
        subpath = cache_subpath(py_file, root)
        return locator.get_suitable_cache_subpath(py_file) if subpath is None else subpath

    return type(
        f"Stamped{locator.__name__}",
        (locator,),
        {
            "get_source_stamp": get_source_stamp,
            "get_suitable_cache_subpath": classmethod(get_suitable_cache_subpath),
        },
    )


def install(root: Path = PACKAGE_ROOT) -> None:
    """Stamp the cached kernels of files under ``root`` (see the module docstring); kernels
    decorated before the call keep Numba's stamp. Idempotent per ``root``."""
    # CacheImpl in recent Numba releases, _CacheImpl in older ones
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # type: ignore[attr-defined]
    installed = impl.__dict__.get("_pagedattn_roots", ())
    if root in installed:
        return
    impl._locator_classes = [
        _stamped(cls, root) if issubclass(cls, caching._SourceFileBackedLocatorMixin) else cls
        for cls in impl._locator_classes
    ]
    impl._pagedattn_roots = (*installed, root)


def compiled_kernels(prefix: str = "pagedattn.") -> int:
    """How many cached kernels of the modules named ``prefix...`` this process compiled
    instead of loading them from Numba's cache (their cache misses, one per signature): a
    benchmark's peak RSS and first timings include LLVM's work when this is not 0."""
    from numba.core.registry import CPUDispatcher

    kernels = {  # by identity: a kernel imported into other modules counts once
        id(obj): obj
        for name, module in list(sys.modules.items())
        if name.startswith(prefix)
        for obj in list(vars(module).values())
        if isinstance(obj, CPUDispatcher)
    }
    return sum(sum(k.stats.cache_misses.values()) for k in kernels.values())


install()  # on import: pagedattn.kernels imports this module first
