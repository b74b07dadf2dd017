"""Backend test parametrization: every (backend, device) pair available here.

``numpy`` always; ``torch`` on ``cpu`` where torch imports; ``torch`` on ``cuda`` only when
``PAGEDATTN_TEST_DEVICES`` lists ``cuda`` (``scripts/gpu_check.sh`` sets it) and a CUDA
device is visible. Tests take the ``backend`` fixture (a BackendSpec).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from pagedattn.backends import BackendSpec
from tests.fixtures import one_numba_thread, prompt_file, tiny_gguf

__all__ = ["one_numba_thread", "prompt_file", "tiny_gguf"]


def available_backends() -> list[BackendSpec]:
    """The pairs this machine runs: numpy/cpu, torch/cpu (torch installed), torch/cuda
    (asked for in ``PAGEDATTN_TEST_DEVICES`` and present)."""
    specs = [BackendSpec("numpy", "cpu")]
    if importlib.util.find_spec("torch") is None:
        return specs
    specs.append(BackendSpec("torch", "cpu"))
    wanted = os.environ.get("PAGEDATTN_TEST_DEVICES", "").split(",")
    if "cuda" in wanted:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("PAGEDATTN_TEST_DEVICES asks for cuda, but torch sees no GPU")
        specs.append(BackendSpec("torch", "cuda"))
    return specs


BACKENDS = available_backends()
TORCH_BACKENDS = [s for s in BACKENDS if s.name == "torch"]


@pytest.fixture(params=BACKENDS, ids=str)
def backend(request: pytest.FixtureRequest) -> BackendSpec:
    """Each available (backend, device) pair."""
    spec: BackendSpec = request.param
    return spec


@pytest.fixture(params=TORCH_BACKENDS or [None], ids=str)
def torch_backend(request: pytest.FixtureRequest) -> BackendSpec:
    """Each available torch pair (skips where torch is missing)."""
    if request.param is None:
        pytest.skip("torch is not installed")
    spec: BackendSpec = request.param
    return spec


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""
