"""The same greedy request gives bitwise the same tokens and logprobs in a process that compiled
the kernels and in a later one that loaded them from Numba's on-disk cache.

Sums left to fast-math reassociation were vectorized in another order in the compiling process
than in the cached code (decode attention's softmax sum, RMSNorm's sum of squares), so answers
changed at ~1e-8 between the first process and every later one, and on the int8 path the greedy
tokens changed.

``make warm`` runs the worker first on a fresh checkout, so the process that compiles the
suite's kernels records its answers (``compiled-kernels.json`` in the virtual environment): the
test loads every kernel from that cache and compares. When no such record matches the kernels
on disk (the cache was already warm, or a source changed since), both processes run here with
one empty ``NUMBA_CACHE_DIR``: the first compiles everything (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: what ``make warm`` records: the answers of the process that compiled the suite's kernels
WARM_RECORD = Path(sys.prefix) / "compiled-kernels.json"


def _run_worker(out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    subprocess.run(
        [sys.executable, "-m", "tests.engine.cached_kernels_worker", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=1200,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _compiled_and_cached(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The answers of a process that compiled every kernel and of one that loaded them all."""
    if WARM_RECORD.is_file() and "NUMBA_CACHE_DIR" not in os.environ:
        compiled = json.loads(WARM_RECORD.read_text())
        cached = _run_worker(tmp_path / "cached.json")
        if compiled["cache"]["hits"] == 0 and cached["cache"]["misses"] == 0:
            return compiled, cached  # this run's kernels are the ones make warm compiled
    cache_dir = tmp_path / "numba-cache"
    compiled = _run_worker(tmp_path / "fresh.json", cache_dir)
    return compiled, _run_worker(tmp_path / "cached.json", cache_dir)


@pytest.mark.model
@pytest.mark.slow  # compiles every kernel into an empty cache, unless make warm just did
def test_greedy_logprobs_are_bitwise_equal_compiled_and_loaded_from_the_cache(
    tmp_path: Path,
) -> None:
    fresh, cached = _compiled_and_cached(tmp_path)
    # The first process compiled every kernel it ran, the second compiled none (a caller's
    # cached code holds its inlined callees, so it loads fewer entries than the first compiled).
    assert fresh["cache"]["hits"] == 0 and fresh["cache"]["misses"] > 0
    assert cached["cache"]["misses"] == 0 and cached["cache"]["hits"] > 0
    for activations in ("float32", "int8"):
        assert cached[activations]["token_ids"] == fresh[activations]["token_ids"], activations
        assert cached[activations]["logprobs"] == fresh[activations]["logprobs"], activations
