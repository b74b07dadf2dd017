"""Every compiled kernel of the forward and the attention releases the GIL while it runs, so a
server's event loop (another Python thread) streams tokens while the engine thread computes."""

from __future__ import annotations

import importlib
import pkgutil

from numba.core.registry import CPUDispatcher

import pagedattn.kernels
import pagedattn.model


def kernels() -> dict[str, CPUDispatcher]:
    found = {}
    for package in (pagedattn.kernels, pagedattn.model):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if isinstance(value, CPUDispatcher) and value.__module__ == info.name:
                    found[f"{info.name}.{name}"] = value
    return found


def test_every_kernel_releases_the_gil() -> None:
    found = kernels()
    assert "pagedattn.kernels.paged_decode_numba.decode_kernel" in found
    assert "pagedattn.kernels.paged_prefill_numba.prefill_kernel" in found
    assert "pagedattn.model.decode_layer.decode_layer" in found
    holding = sorted(
        name
        for name, kernel in found.items()
        if not kernel.targetoptions.get("nogil") and not kernel.targetoptions.get("inline")
    )
    assert holding == []
