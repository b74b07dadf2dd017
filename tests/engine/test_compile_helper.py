"""The compile helper: on a cold kernel cache a second process compiles the fused decode layer
into Numba's on-disk cache, where the warm-up then finds it; on a warm cache none starts.

The cold cache is the suite's own (``make warm`` fills it) without the fused decode layer: the
helper then compiles exactly what it exists for, the layer, and loads the kernels around it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedattn.engine import compile_helper
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.kernels.numba_cache import cache_subpath

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "pagedattn"
CACHED = "from pagedattn.engine.compile_helper import kernels_cached; print(kernels_cached())"


def _python(args: list[str], cache: Path) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _cache_without_the_decode_layer(cache: Path) -> None:
    """Numba's cache as ``NUMBA_CACHE_DIR=cache`` lays it out, holding the suite's compiled
    kernels (``src/**/__pycache__``) except the fused decode layer's."""
    for entry in PACKAGE.glob("**/__pycache__/*.nb[ic]"):
        if entry.name.startswith("decode_layer.decode_layer-"):
            continue
        source = entry.parent.parent / (entry.name.split(".", 1)[0] + ".py")
        subpath = cache_subpath(str(source))
        assert subpath is not None
        folder = cache / subpath
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(entry, folder / entry.name)


@pytest.mark.model
def test_no_helper_starts_on_a_warm_cache() -> None:
    engine = LLMEngine.from_config()
    assert compile_helper.kernels_cached()  # the suite's kernels are compiled (make warm)
    assert compile_helper.start(engine) is None


@pytest.mark.model
@pytest.mark.slow  # compiles the fused decode layer
def test_the_helper_fills_a_cold_cache_with_the_fused_decode_layer(tmp_path: Path) -> None:
    cache = tmp_path / "numba"
    _cache_without_the_decode_layer(cache)
    assert _python(["-c", CACHED], cache) == "False"
    _python(["-m", "pagedattn.engine.compile_helper"], cache)
    assert _python(["-c", CACHED], cache) == "True"
