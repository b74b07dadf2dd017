"""Host <-> backend transfers: round trips, read-only inputs, and the argument errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pagedattn.backends import BackendSpec
from pagedattn.backends.arrays import backend_array, host_ints, to_backend, to_host
from pagedattn.backends.paged_ops import paged_ops
from pagedattn.kernels import paged_attention_decode

TORCH_CPU = BackendSpec("torch", "cpu")


def test_torch_round_trip_and_read_only_inputs_are_copied() -> None:
    torch = pytest.importorskip("torch")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it aliases a read-only buffer
        t = to_backend(a, TORCH_CPU)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    t += 1  # a copy: the read-only source is untouched
    np.testing.assert_array_equal(to_host(t), a + 1)
    np.testing.assert_array_equal(host_ints(torch.tensor([3, 4])), [3, 4])
    assert to_backend(t, TORCH_CPU) is t


def test_numpy_backend_keeps_host_arrays_and_the_numba_kernels() -> None:
    a = np.ones((2, 2), np.float32)
    assert to_backend(a, BackendSpec("numpy", "cpu")) is a
    assert paged_ops(BackendSpec("numpy", "cpu")).paged_attention_decode is paged_attention_decode


def test_backend_array_names_the_argument() -> None:
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"q: expected a float32 array \(h, d\) = \(2, 3\), got"):
        backend_array("q", [[0.0]], TORCH_CPU, (2, 3), "(h, d)")
    with pytest.raises(ValueError, match=r"q: expected float32 \(h, d\) = \(2, 3\), got"):
        backend_array("q", np.zeros((2, 3), np.float64), TORCH_CPU, (2, 3), "(h, d)")
    with pytest.raises(ValueError, match="expected a NumPy, torch or CuPy array, got list"):
        to_host([1.0])
