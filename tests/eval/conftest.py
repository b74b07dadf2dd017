"""Fixtures: the tiny random GGUF Llama (fast) and one numba thread for every test here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.fixtures import one_numba_thread, tiny_gguf

__all__ = ["one_numba_thread", "tiny_gguf"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""


@pytest.fixture(scope="session")
def tiny_eval_model(tiny_gguf: Path) -> LlamaModel:
    return LlamaModel.from_loaded(load_model(tiny_gguf))
