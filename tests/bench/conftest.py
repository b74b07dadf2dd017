"""Fixtures: the tiny GGUF model, and one numba thread for every test here."""

from __future__ import annotations

import pytest

from tests.fixtures import one_numba_thread, prompt_file, tiny_gguf

__all__ = ["one_numba_thread", "prompt_file", "tiny_gguf"]


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""
