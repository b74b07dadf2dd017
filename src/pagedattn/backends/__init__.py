"""Array backends: which array library (and device) holds the page pool and runs the model.

The engine, scheduler and cache manager deal only in page ids, page tables and token ids; a
backend owns everything that touches device arrays: the page pool's storage, ``write_kv``, paged
attention and the model's dense work. Only token ids, tables and logits / sampled ids cross
between the host and the device.

| backend | devices | what it is |
|---|---|---|
| ``numpy`` | ``cpu`` | NumPy + Numba kernels; the default and the reference |
| ``torch`` | ``cpu``, ``cuda`` | PyTorch (pinned ``torch==2.13.0``, the ``torch`` extra) |
| ``cupy`` | ``cuda`` | CuPy, through the array namespace |

:func:`resolve_backend` validates a (backend, device) pair and that its library and device exist,
and raises :class:`BackendError` with one line saying what to install or choose otherwise.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pagedattn.backend_spec import (
    BACKENDS,
    DEFAULT_DEVICE,
    DEVICES,
    BackendError,
    BackendSpec,
    validate_backend,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_DEVICE",
    "DEVICES",
    "BackendError",
    "BackendSpec",
    "array_module",
    "resolve_backend",
    "validate_backend",
]

_INSTALL = {
    "numpy": "pip install numpy",
    "torch": "pip install 'pagedattn[torch]' (torch==2.13.0)",
    "cupy": "pip install 'pagedattn[cupy]' (cupy-cuda12x: an NVIDIA GPU and CUDA 12)",
}


def resolve_backend(name: str = "numpy", device: str | None = None) -> BackendSpec:
    """:func:`validate_backend`, then check that the library imports and the device exists.

    Raises:
        BackendError: as :func:`validate_backend`, or the library is not installed, or
            CUDA was asked for and no CUDA device is visible to it.
    """
    spec = validate_backend(name, device)
    module = _import(spec.name)
    if spec.device == "cuda" and not _cuda_available(spec.name, module):
        raise BackendError(
            f"backend {spec.name!r} found no CUDA device (is a GPU visible and the {spec.name} "
            "build CUDA-enabled?); use --device cpu"
        )
    return spec


def array_module(spec: BackendSpec) -> ModuleType:
    """The array library of ``spec`` (``numpy``, ``torch`` or ``cupy``), imported.

    Raises:
        BackendError: the library is not installed.
    """
    return _import(spec.name)


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise BackendError(
            f"backend {name!r} needs the {name} library, which is not installed: {_INSTALL[name]}"
        ) from e


def _cuda_available(name: str, module: ModuleType) -> bool:
    try:
        if name == "torch":
            return bool(module.cuda.is_available())
        return int(module.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # CuPy raises its own CUDARuntimeError when no driver is present
        return False
