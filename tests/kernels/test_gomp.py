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


@pytest.mark.parametrize(
    ("env", "seen"),
    [({}, "2000"), ({"PAGEDATTN_GOMP_SPINCOUNT": "50"}, "50"), ({"GOMP_SPINCOUNT": "7"}, "7")],
)
def test_libgomp_loads_with_a_short_spin_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], seen: str
) -> None:
    from numba.np.ufunc import parallel

    from pagedattn.kernels import gomp

    for name in ("GOMP_SPINCOUNT", "PAGEDATTN_GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    launched: list[str | None] = []
    monkeypatch.setattr(
        parallel, "_launch_threads", lambda: launched.append(os.environ.get("GOMP_SPINCOUNT"))
    )
    gomp.start_numba_threads()
    # what libgomp reads while it loads: 2000 by default, a long spin stalls on busy machines
    assert launched == [seen]
    assert os.environ.get("GOMP_SPINCOUNT") == env.get("GOMP_SPINCOUNT")
