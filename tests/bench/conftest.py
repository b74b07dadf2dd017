"""CLI fixtures: the tiny random Llama of tests/model written as a GGUF file (with its byte-level
tokenizer and ChatML template), and one numba thread (2 shared cores; tiny kernels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numba
import pytest

from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    path = tmp_path_factory.mktemp("cli-tiny") / "tiny.gguf"
    return write_tiny_gguf(path, config, random_weights(config, seed=1))


@pytest.fixture(autouse=True)
def _one_numba_thread() -> Iterator[None]:
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)
