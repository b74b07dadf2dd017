"""The compile helper: on a cold kernel cache a second process compiles the fused decode layer
into Numba's on-disk cache, where the warm-up then finds it; on a warm cache none starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedattn.engine import compile_helper
from pagedattn.engine.llm_engine import LLMEngine

ROOT = Path(__file__).resolve().parents[2]
CACHED = "from pagedattn.engine.compile_helper import kernels_cached; print(kernels_cached())"


def _python(args: list[str], cache: Path) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.model
def test_no_helper_starts_on_a_warm_cache() -> None:
    engine = LLMEngine.from_config()
    assert compile_helper.kernels_cached()  # the suite's kernels are compiled (make warm)
    assert compile_helper.start(engine) is None


@pytest.mark.model
@pytest.mark.slow  # compiles the fused decode layer into an empty cache
def test_the_helper_fills_an_empty_cache_with_the_fused_decode_layer(tmp_path: Path) -> None:
    cache = tmp_path / "numba"
    assert _python(["-c", CACHED], cache) == "False"
    _python(["-m", "pagedattn.engine.compile_helper"], cache)
    assert _python(["-c", CACHED], cache) == "True"
