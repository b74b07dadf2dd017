"""Fixtures shared by several test folders; a folder's conftest imports the ones it uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numba
import pytest

from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf


def metric_samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, keyed ``name{label="v",...}`` (labels
    sorted, ``model_name`` dropped), parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(
                f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name"
            )
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of tests/model written as a GGUF file (byte-level tokenizer,
    ChatML template), loadable with ``--model``. Seed 1, not tests/model's seed 0: its greedy
    output decodes to printable text over several deltas, which the streaming tests need."""
    config = tiny_config()
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    return write_tiny_gguf(path, config, random_weights(config, seed=1))


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain-text corpus file for the bench commands' ``--prompt-file``."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("the rain in spain stays mainly on the plain. " * 200, encoding="utf-8")
    return path


@pytest.fixture
def one_numba_thread() -> Iterator[None]:
    """Run with one numba thread: on the 2 shared cores, thread start-up dominates the tiny
    model's kernels. Results do not depend on the thread count."""
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)
