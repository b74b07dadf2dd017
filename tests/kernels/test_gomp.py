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


RELEASE_PROBE = """
import json, os, threading, time
import numba, numpy as np
import pagedattn.kernels
from pagedattn.kernels.gomp import release_thread_workers

@numba.njit(parallel=True)
def bump(a):
    for i in numba.prange(a.shape[0]):
        a[i] += 1.0

def tasks():
    return len(os.listdir("/proc/self/task"))

a = np.zeros(1 << 16)
bump(a)  # compiles, and starts this thread's team
with_team = tasks()
released = release_thread_workers()
deadline = time.monotonic() + 5
while tasks() >= with_team and time.monotonic() < deadline:
    time.sleep(0.01)
after = tasks()
other = threading.Thread(target=bump, args=(a,))  # another thread still runs kernels
other.start(); other.join()
print(json.dumps([with_team, released, after, float(a[0])]))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_release_lets_the_calling_threads_openmp_workers_exit() -> None:
    """A thread that ran a parallel kernel holds a worker thread per extra Numba thread (one,
    with 2); after release_thread_workers() it has exited (counted in /proc), and kernels
    still run, on another thread too."""
    env = {k: v for k, v in os.environ.items() if "GOMP" not in k} | {"NUMBA_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", RELEASE_PROBE], env=env, capture_output=True, text=True, check=True
    )
    with_team, released, after, value = json.loads(out.stdout)
    if not released:  # another threading layer than libgomp (TBB, workqueue)
        pytest.skip("libgomp is not Numba's threading layer here")
    assert after == with_team - 1
    assert value == 2.0
