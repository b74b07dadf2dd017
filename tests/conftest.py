"""Shared test configuration: hypothesis profiles (CI runs the `ci` profile), and the modules
that compile kernels for other CPUs or into an empty cache collected first, so that with
``pytest -n`` their minutes of compiling start at once, beside everything else, instead of
ending the run on one worker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

#: modules whose tests compile for minutes on a cold cache, longest first
COMPILING_MODULES = (
    "tests/model/test_portability.py",
    "tests/model/test_int8_paths.py",
    "tests/engine/test_compile_helper.py",
    "tests/engine/test_cached_kernels.py",
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
    """The compiling modules first, in :data:`COMPILING_MODULES` order; the rest as collected
    (a stable sort: the same order in every xdist worker)."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in COMPILING_MODULES:
            return COMPILING_MODULES.index(path)
        return len(COMPILING_MODULES)

    items.sort(key=rank)
