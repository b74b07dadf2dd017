"""Tests of benchmarks/ (the peer comparisons of a source checkout): the repository root on
sys.path so that ``benchmarks`` imports, the tiny GGUF model, one numba thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures import one_numba_thread, prompt_file, tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

__all__ = ["one_numba_thread", "prompt_file", "tiny_gguf"]


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""
