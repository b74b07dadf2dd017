"""The paged-kernel implementations the kernel tests run over, as pytest params.

``numba``: the NumPy + Numba kernels (the default backend). ``xp-*``: the array-namespace
kernels of :mod:`pagedattn.backends.xp_kernels` on NumPy, torch CPU (both always run, so the
non-NumPy code path is part of ``make test``), torch CUDA and CuPy (skipped without a GPU).
``ATTENTION_PARAMS`` adds ``xp-strict``: the decode / prefill kernels on ``array_api_strict``,
the array API's reference namespace, which has nothing outside the standard: what passes there
uses only the standard, so runs the same on any conforming library (CuPy included).
(``write_kv``'s integer-array assignment is outside the standard: not run there.)
Each carries ``to_backend`` (host NumPy -> the backend's array) and ``to_host``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from pagedattn.backends import BackendError, BackendSpec, resolve_backend
from pagedattn.backends.arrays import to_backend, to_host
from pagedattn.backends.paged_ops import PagedOps, paged_ops


@dataclass(frozen=True)
class Impl:
    ops: PagedOps
    to_backend: Callable[[np.ndarray], Any]
    to_host: Callable[[Any], np.ndarray] = to_host


def skip_reason(name: str, device: str) -> str | None:
    """None when (name, device) runs here, else the reason to skip."""
    if importlib.util.find_spec(name) is None:
        return f"{name} is not installed"
    try:
        resolve_backend(name, device)
    except BackendError as e:
        return str(e)
    return None


def impl(kind: str) -> Impl:
    """The implementation behind an ``IMPL_PARAMS`` id."""
    if kind == "numba":
        spec = BackendSpec("numpy", "cpu")
        return Impl(paged_ops(spec), lambda a: a)
    from pagedattn.backends import xp_kernels

    xp_ops = PagedOps(
        xp_kernels.write_kv, xp_kernels.paged_attention_decode, xp_kernels.paged_attention_prefill
    )
    if kind == "xp-strict":
        import array_api_strict

        return Impl(xp_ops, array_api_strict.asarray, lambda a: np.asarray(a))
    name, _, device = kind.removeprefix("xp-").partition("-")
    spec = BackendSpec(name, device or "cpu")
    return Impl(xp_ops, lambda a: to_backend(a, spec))


def _param(kind: str, name: str, device: str) -> Any:
    reason = skip_reason(name, device)
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(kind, id=kind, marks=marks)


IMPL_PARAMS = [
    _param("numba", "numpy", "cpu"),
    _param("xp-numpy", "numpy", "cpu"),
    _param("xp-torch-cpu", "torch", "cpu"),
    _param("xp-torch-cuda", "torch", "cuda"),
    _param("xp-cupy-cuda", "cupy", "cuda"),
]
_STRICT = importlib.util.find_spec("array_api_strict") is None
ATTENTION_PARAMS = [
    *IMPL_PARAMS,
    pytest.param(
        "xp-strict",
        id="xp-strict",
        marks=[pytest.mark.skipif(_STRICT, reason="array-api-strict is not installed")],
    ),
]
