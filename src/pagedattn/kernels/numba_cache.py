"""Numba's on-disk cache, made safe against edits of a kernel's callees and constants.

Numba stamps a cached kernel with its own source file's modification time and size only
(``numba.core.caching._SourceFileBackedLocatorMixin``). Our kernels call, and are compiled
together with, kernels and constants of other files (``decode_layer`` inlines the decode
attention of ``paged_decode_numba``, which reads ``numba_consts``): after an edit of a callee, a
process that loads the caller from the cache runs the callee's old code, silently.

Importing this module calls :func:`install`, which replaces each of Numba's cache locators by
a subclass whose stamp for a file of this package is a hash of the contents of every ``.py``
file of the folders that hold compiled code (:data:`STAMPED_FOLDERS`) and of the file itself:
any edit there recompiles every kernel of the package once, files elsewhere keep Numba's own
stamp. Where a kernel's cache files
go (``__pycache__`` beside the source, ``NUMBA_CACHE_DIR``, the user-wide directory) is Numba's
choice, as before.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Any

from numba.core import caching

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # src/pagedattn
STAMPED_FOLDERS = ("kernels", "model")  # the folders whose modules Numba compiles together


@functools.cache
def _folders_digest(root: Path, folders: tuple[str, ...]) -> str:
    """sha256 over the relative path and bytes of every ``*.py`` in ``root/folder``, sorted."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def source_stamp(py_file: str, root: Path = PACKAGE_ROOT) -> str | None:
    """The cache stamp of a kernel defined in ``py_file``: a hash of :data:`STAMPED_FOLDERS` of
    ``root`` and of the file itself, or None for a file outside ``root`` (Numba's own stamp)."""
    path = Path(py_file).resolve()
    if not path.is_relative_to(root):
        return None
    try:
        own = hashlib.sha256(path.read_bytes()).hexdigest()
        return f"{_folders_digest(root, STAMPED_FOLDERS)}:{own}"
    except OSError:  # not a plain file (a zipped package): Numba's own stamp
        return None


def _stamped(locator: type[Any], root: Path) -> type[Any]:
    """``locator`` whose source stamp is :func:`source_stamp` for files under ``root``."""

    def get_source_stamp(self: Any) -> Any:
        stamp = source_stamp(self._py_file, root)
        return locator.get_source_stamp(self) if stamp is None else stamp

    return type(f"Stamped{locator.__name__}", (locator,), {"get_source_stamp": get_source_stamp})


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
