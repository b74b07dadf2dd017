"""Start Numba's thread pool with a short GNU OpenMP spin, without touching the environment.

Numba's parallel kernels run on GNU OpenMP (its ``omp`` threading layer), whose idle threads
spin ~300k iterations after each parallel region by default. Between two kernels the model may
call other multithreaded libraries, whose threads then share the cores with those spinning
ones, and a second process on the same cores (two servers, a server beside a test run) meets
every spinning thread of this one: a long spin holds a core while the thread each barrier waits
for sits descheduled. Too short a spin costs the other way: a decode step is ~150 parallel
regions, and a thread that went to sleep between two of them is woken by the kernel (a futex, on
a virtual machine an inter-processor interrupt through the hypervisor) at the next one.

The default, 2000 iterations, keeps a decode step's back-to-back regions
warm and gives the core back soon after. Measured on a 2-core Intel Xeon VM, SmolLM2 Q4_1,
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
"""

from __future__ import annotations

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
