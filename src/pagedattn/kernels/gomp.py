"""Start Numba's thread pool with a short GNU OpenMP spin, without touching the environment.

Numba's parallel kernels run on GNU OpenMP (its ``omp`` threading layer), whose idle threads
spin ~300k iterations after each parallel region by default. Between two kernels the model may
call other multithreaded libraries, whose threads then share the cores with those spinning
ones, and a second process on the same cores (two servers, a server beside a test run) meets
every spinning thread of this one: a long spin holds a core while the thread each barrier waits
for sits descheduled. Too short a spin costs the other way: a decode step is ~150 parallel
regions, and a thread that went to sleep between two of them is woken by the kernel (a futex, on
a virtual machine an inter-processor interrupt through the hypervisor) at the next one.

The default, 2000 iterations, keeps a decode step's back-to-back regions warm and gives the
core back soon after. Measured on a 2-core Intel Xeon VM, SmolLM2 Q4_1,
``generate --max-tokens 128 --ignore-eos``, decode tok/s alone / each of two processes side by
side: 1000 iterations 124-129 / 68; 2000: 180-182 / 53; 10000: 192 / 24 (llama.cpp's
``llama-bench -t 2`` on the same file: 111 alone / 20.5 side by side).

libgomp reads ``GOMP_SPINCOUNT`` once, when it is loaded (Numba loads it with its threading
layer). :func:`start_numba_threads` sets the variable only while it starts the pool and then
restores the environment, so an embedding application's ``os.environ`` (and its subprocesses)
never see a value it did not set. Overrides, read at that moment:

- ``GOMP_SPINCOUNT`` set by the user: used as is (the user's value wins);
- ``PAGEDATTN_GOMP_SPINCOUNT``: the spin count to use (default ``2000``); empty = libgomp's
  own default.

It has no effect when libgomp was already loaded by something else, or when Numba uses another
threading layer (TBB, workqueue).

libgomp keeps a team of worker threads for each thread that starts a parallel region, and once
it manages more threads than there are CPUs it cuts every spin short
(``gomp_throttled_spin_count_var``, at most 1000 iterations). A server that loads and warms up
its engine on one thread and then steps it on another holds two teams: on a 2-core Xeon VM its
decode steps took 20 ms instead of 8.5. :func:`release_thread_workers` lets the calling
thread's team go before the hand-off.
"""

from __future__ import annotations

import ctypes
import os

DEFAULT_SPINCOUNT = "2000"


def start_numba_threads() -> None:
    """Launch Numba's thread pool now, with libgomp's spin count as described above."""
    from numba.np.ufunc import parallel

    spin = os.environ.get("PAGEDATTN_GOMP_SPINCOUNT", DEFAULT_SPINCOUNT)
    if "GOMP_SPINCOUNT" in os.environ or not spin:
        parallel._launch_threads()  # type: ignore[no-untyped-call]
        return
    os.environ["GOMP_SPINCOUNT"] = spin
    try:
        parallel._launch_threads()  # type: ignore[no-untyped-call]
    finally:
        del os.environ["GOMP_SPINCOUNT"]


_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t (OpenMP 5.0)


def _loaded_libgomp() -> str | None:
    """The path of the libgomp this process has loaded (a wheel may bundle its own, under
    another name), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith("libgomp"):
                    return path
    except OSError:  # no /proc (not Linux)
        pass
    return None


def release_thread_workers() -> bool:
    """Let the OpenMP worker threads of the calling thread's team exit (libgomp's
    ``omp_pause_resource_all(omp_pause_soft)``; a later parallel region on this thread starts
    a new team), so that a thread handing its engine to another leaves one team behind.

    Returns:
        True when libgomp let them go; False when no libgomp is loaded (another threading
        layer or platform), it predates OpenMP 5.0, or it refused (inside a parallel region).
    """
    path = _loaded_libgomp()
    if path is None:
        return False
    try:
        pause = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):
        return False
    pause.restype, pause.argtypes = ctypes.c_int, [ctypes.c_int]
    return bool(pause(_OMP_PAUSE_SOFT) == 0)
