"""Storage test fixtures: a private redis-server, one numba thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import one_numba_thread, tiny_gguf
from tests.redis_server import RedisServer

__all__ = ["one_numba_thread", "tiny_gguf"]


@pytest.fixture(autouse=True)
def _one_numba_thread(one_numba_thread: None) -> None:
    """Every test here runs with one numba thread (see tests/fixtures.py)."""


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()
