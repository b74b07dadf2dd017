"""Shared test configuration: hypothesis profiles (CI runs the `ci` profile), and the order in
which ``pytest -n`` hands modules to its workers: the modules that compile kernels for other
CPUs or into an empty cache first (their minutes of compiling start at once, beside
everything else), then the others longest first (``module_seconds.json``, the seconds each
took in a full run), so that no long module starts last and ends the run on one worker.
``python -m tests.module_seconds JUNIT.xml`` records those seconds again from a run's
``--junitxml`` report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests import hf_gguf

# One block kernel for every GGUF block kind (pagedattn.model.block_ir.ALL_KINDS_ONLY): the
# suite meets most kinds and combinations, each of which would otherwise compile its own
# kernel; `make warm` compiles with the same setting. test_block_dot checks the default, a
# kernel per model's kinds, in a subprocess without it.
os.environ.setdefault("PAGEDATTN_ALL_BLOCK_KINDS", "1")
# The suite's workers (pytest -n) share the cores, each with a thread per core: the shortest
# spin that keeps a decode step's regions warm alone costs them most (pagedattn.kernels.gomp).
os.environ.setdefault("PAGEDATTN_GOMP_SPINCOUNT", "1000")

hf_gguf.install()  # transformers parses a GGUF once per file, not once per from_pretrained

#: modules whose tests compile for minutes on a cold cache, longest first
COMPILING_MODULES = (
    "tests/model/test_portability.py",
    "tests/model/test_int8_paths.py",
    "tests/engine/test_compile_helper.py",
    "tests/engine/test_cached_kernels.py",
)

#: test module -> seconds it took in a full run (modules under a few seconds are not listed)
MODULE_SECONDS: dict[str, float] = json.loads(
    (Path(__file__).with_name("module_seconds.json")).read_text(encoding="utf-8")
)

settings.register_profile(
    "dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The compiling modules first, in :data:`COMPILING_MODULES` order, then the rest longest
    first by :data:`MODULE_SECONDS` (a stable sort: the same order in every xdist worker)."""

    def rank(item: pytest.Item) -> tuple[int, float]:
        path = item.nodeid.split("::", 1)[0]
        if path in COMPILING_MODULES:
            return COMPILING_MODULES.index(path), 0.0
        return len(COMPILING_MODULES), -MODULE_SECONDS.get(path, 0.0)

    items.sort(key=rank)
