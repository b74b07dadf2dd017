"""The same greedy request gives bitwise the same tokens and logprobs in a process that compiled
the kernels and in a later one that loaded them from Numba's on-disk cache.

Sums left to fast-math reassociation were vectorized in another order in the compiling process
than in the cached code (decode attention's softmax sum, RMSNorm's sum of squares), so answers
changed at ~1e-8 between the first process and every later one, and on the int8 path the greedy
tokens changed. Both processes run with one empty ``NUMBA_CACHE_DIR``: the first compiles
everything (about 3 minutes on 2 cores), the second must load every kernel from the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_worker(cache_dir: Path, out: Path) -> dict:
    env = os.environ | {"NUMBA_CACHE_DIR": str(cache_dir)}
    subprocess.run(
        [sys.executable, "-m", "tests.engine.cached_kernels_worker", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=1200,
    )
    return json.loads(out.read_text())


@pytest.mark.model
@pytest.mark.slow  # compiles every kernel into an empty cache
def test_greedy_logprobs_are_bitwise_equal_compiled_and_loaded_from_the_cache(
    tmp_path: Path,
) -> None:
    cache_dir = tmp_path / "numba-cache"
    fresh = _run_worker(cache_dir, tmp_path / "fresh.json")
    cached = _run_worker(cache_dir, tmp_path / "cached.json")
    # The first process compiled every kernel it ran, the second compiled none (a caller's
    # cached code holds its inlined callees, so it loads fewer entries than the first compiled).
    assert fresh["cache"]["hits"] == 0 and fresh["cache"]["misses"] > 0
    assert cached["cache"]["misses"] == 0 and cached["cache"]["hits"] > 0
    for activations in ("float32", "int8"):
        assert cached[activations]["token_ids"] == fresh[activations]["token_ids"], activations
        assert cached[activations]["logprobs"] == fresh[activations]["logprobs"], activations
