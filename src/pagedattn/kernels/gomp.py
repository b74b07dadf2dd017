"""Start Numba's thread pool with a short GNU OpenMP spin, without touching the environment.

Numba's parallel kernels run on GNU OpenMP (its ``omp`` threading layer), whose idle threads
spin ~300k iterations after each parallel region by default. Between two kernels the model may
call other multithreaded libraries, whose threads then share the cores with those spinning
ones. On a machine shared with another busy process a long spin holds a core while the thread
every barrier waits for sits descheduled, which costs a scheduler slice per parallel region.
A spin of 1000 iterations (a few microseconds) keeps the back-to-back regions of a decode step
warm and gives the core back soon after.

libgomp reads ``GOMP_SPINCOUNT`` once, when it is loaded (Numba loads it with its threading
layer). :func:`start_numba_threads` sets the variable only while it starts the pool and then
restores the environment, so an embedding application's ``os.environ`` (and its subprocesses)
never see a value it did not set. Overrides, read at that moment:

- ``GOMP_SPINCOUNT`` set by the user: used as is (the user's value wins);
- ``PAGEDATTN_GOMP_SPINCOUNT``: the spin count to use (default ``1000``); empty = libgomp's
  own default.

It has no effect when libgomp was already loaded by something else, or when Numba uses another
threading layer (TBB, workqueue).
"""

from __future__ import annotations

import os

DEFAULT_SPINCOUNT = "1000"


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
