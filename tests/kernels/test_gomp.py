"""Importing the kernels starts Numba's pool without leaving GOMP_SPINCOUNT in os.environ."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = (
    "import os, json, numba, pagedattn.kernels;"
    "print(json.dumps([os.environ.get('GOMP_SPINCOUNT'), numba.threading_layer()]))"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, None), ({"GOMP_SPINCOUNT": "7"}, "7"), ({"PAGEDATTN_GOMP_SPINCOUNT": ""}, None)],
)
def test_import_leaves_the_environment_as_the_user_set_it(
    env: dict[str, str], expected: str | None
) -> None:
    base = {k: v for k, v in os.environ.items() if "GOMP_SPINCOUNT" not in k}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=base | env, capture_output=True, text=True, check=True
    )
    spin, layer = json.loads(out.stdout)
    assert spin == expected
    assert layer in ("omp", "tbb", "workqueue")  # the pool is running
