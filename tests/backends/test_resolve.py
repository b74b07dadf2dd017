"""Backend selection: names, pairs, and the one-line errors for what is missing."""

from __future__ import annotations

import importlib.util

import pytest

from pagedattn.backends import BackendError, BackendSpec, resolve_backend, validate_backend


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [
        ("numpy", None, BackendSpec("numpy", "cpu")),
        ("numpy", "cpu", BackendSpec("numpy", "cpu")),
        ("torch", None, BackendSpec("torch", "cpu")),
        ("torch", "cuda", BackendSpec("torch", "cuda")),
        ("cupy", None, BackendSpec("cupy", "cuda")),
    ],
)
def test_valid_pairs(name: str, device: str | None, expected: BackendSpec) -> None:
    assert validate_backend(name, device) == expected


@pytest.mark.parametrize(
    ("name", "device", "fragment"),
    [
        ("numpy", "cuda", "does not run on device 'cuda'"),
        ("cupy", "cpu", "does not run on device 'cpu'"),
        ("jax", None, "backend 'jax' is unknown"),
        ("torch", "tpu", "device 'tpu' is unknown"),
    ],
)
def test_invalid_pairs_are_one_line_errors(name: str, device: str | None, fragment: str) -> None:
    with pytest.raises(BackendError, match=fragment) as info:
        validate_backend(name, device)
    assert "\n" not in str(info.value)


def test_torch_cpu_resolves_where_torch_is_installed() -> None:
    pytest.importorskip("torch")
    assert resolve_backend("torch", "cpu") == BackendSpec("torch", "cpu")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_missing_cupy_says_what_to_install() -> None:
    with pytest.raises(BackendError, match=r"pip install .pagedattn\[cupy\].") as info:
        resolve_backend("cupy", "cuda")
    assert "\n" not in str(info.value)


def test_cuda_without_a_device_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(BackendError, match="found no CUDA device"):
        resolve_backend("torch", "cuda")
