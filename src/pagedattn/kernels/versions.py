"""The Numba and llvmlite releases the kernels are tested with, checked when they load.

The kernel cache's stamp (:mod:`pagedattn.kernels.numba_cache`) and the thread-pool start
(:mod:`pagedattn.kernels.gomp`) use Numba internals that a release may change or remove; the
kernels' intrinsics emit LLVM IR for llvmlite's LLVM. On another release they could misbehave
silently (a stale kernel loaded from the cache), so importing the kernels refuses it with one
error naming what was found and what is tested. ``PAGEDATTN_ALLOW_UNTESTED_NUMBA=1`` turns the
error into a warning, for trying a new release. pyproject.toml pins the same ranges.
"""

from __future__ import annotations

import os
import warnings

# package -> the (major, minor) releases tested; any patch release of them is accepted
TESTED = {"numba": ((0, 68),), "llvmlite": ((0, 50),)}
ALLOW_UNTESTED = "PAGEDATTN_ALLOW_UNTESTED_NUMBA"


def _release(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def untested_versions(found: dict[str, str]) -> list[str]:
    """``"name version"`` of each package of ``found`` (name -> version) not in :data:`TESTED`."""
    return [f"{name} {v}" for name, v in found.items() if _release(v) not in TESTED[name]]


def _tested_text() -> str:
    return " and ".join(
        f"{name} {' / '.join(f'{a}.{b}.x' for a, b in releases)}"
        for name, releases in TESTED.items()
    )


def check_numba_versions() -> None:
    """Raise ImportError (or warn, with ``PAGEDATTN_ALLOW_UNTESTED_NUMBA=1``) when the installed
    numba or llvmlite is not a tested release."""
    import llvmlite
    import numba

    found = {"numba": str(numba.__version__), "llvmlite": str(llvmlite.__version__)}
    untested = untested_versions(found)
    if not untested:
        return
    message = (
        f"pagedattn's kernels are tested with {_tested_text()} (they use Numba internals), "
        f"found {', '.join(untested)}: install a tested release "
        f"(pip install 'numba>=0.68,<0.69' 'llvmlite>=0.50,<0.51'), or set "
        f"{ALLOW_UNTESTED}=1 to try this one"
    )
    if os.environ.get(ALLOW_UNTESTED) == "1":
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    raise ImportError(message)
