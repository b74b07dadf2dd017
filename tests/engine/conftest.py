"""Engine tests run the tiny model with one numba thread."""

from __future__ import annotations

import pytest
from tests.fixtures import one_numba_thread

__all__ = ["one_numba_thread"]


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""
