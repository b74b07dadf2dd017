"""Where the tests that compile the kernels for other CPUs keep Numba's cache between runs.

Compiling every kernel for another CPU (``NUMBA_CPU_NAME``) takes minutes of CPU per CPU name.
The compiled code depends only on the compiler (Numba, llvmlite, the Python version), on the
target CPU and on the sources: Numba keys each cache entry by its signature and target CPU,
and :mod:`pagedattn.kernels.numba_cache` stamps it with a hash of the sources it was compiled
from (an entry compiled from other sources is never used, it is replaced). So the cache lives
outside the checkout, in one folder per compiler version, and a clean clone or a second run
compiles only what changed: ``$PAGEDATTN_TEST_KERNEL_CACHE`` when set, else
``$XDG_CACHE_HOME/pagedattn/test-kernels`` (``~/.cache/pagedattn/test-kernels``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import llvmlite
import numba


def compiler_key() -> str:
    """The compiler's versions, one folder name: e.g. ``numba-0.68.0-llvmlite-0.50.0-py311``."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return f"numba-{numba.__version__}-llvmlite-{llvmlite.__version__}-{py}"


def kernel_cache_dir(name: str) -> Path:
    """The (created) ``NUMBA_CACHE_DIR`` of the tests called ``name``, for this compiler."""
    root = os.environ.get("PAGEDATTN_TEST_KERNEL_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "pagedattn" / "test-kernels")
    path = Path(root) / compiler_key() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
