"""Engine tests run the tiny model with one numba thread (the test machine has 2 shared cores;
thread start-up dominates such small kernels). Results do not depend on the thread count."""

from __future__ import annotations

from collections.abc import Iterator

import numba
import pytest


@pytest.fixture(autouse=True)
def _one_numba_thread() -> Iterator[None]:
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)
