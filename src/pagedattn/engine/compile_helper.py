"""A second process that compiles the fused decode layer while the warm-up compiles the rest.

Numba compiles on the calling thread, one kernel after another. On a cold cache most of the
warm-up is two kernels: the fused decode layer and the register block matmul. The warm-up
(:mod:`pagedattn.engine.warm_up`) meets the decode layer last, so :func:`start` runs, in a
child process, a one-token request (a one-token prompt is a decode step: it takes the fused
decode layer at once) on the same model, KV dtype and activations. Both processes write
Numba's on-disk cache, which is safe across processes; when the warm-up reaches the decode
layer it loads what the child compiled meanwhile instead of compiling it again. The child is
stopped when the warm-up ends (whatever it had left is then compiled, or loaded, by the
warm-up itself). Only engine options travel, as command-line arguments.

``python -m pagedattn.engine.compile_helper [--model PATH] --kv-cache-dtype D --activations A``
is the child.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine


def kernels_cached() -> bool:
    """False when Numba's cache holds no fused decode layer for today's sources (no index
    file, or one stamped for other sources: a first run, or the first after an edit of the
    kernels); True when it does, or when Numba's private cache API is not as expected."""
    from pagedattn.model.decode_layer import decode_layer

    try:
        return bool(decode_layer._cache._cache_file._load_index())  # type: ignore[attr-defined]
    except Exception:  # a private API: unknown means "cached"
        return True


def start(engine: LLMEngine) -> subprocess.Popen[bytes] | None:
    """Start the child for ``engine``'s model when it pays: the NumPy backend, more than one
    CPU, and a cold cache (:func:`kernels_cached`); else None."""
    config = engine.config
    if config.backend != "numpy" or (os.cpu_count() or 1) < 2 or kernels_cached():
        return None
    args = [sys.executable, "-m", "pagedattn.engine.compile_helper"]
    if config.model is not None:
        args += ["--model", str(config.model)]
    args += ["--kv-cache-dtype", config.cache.kv_cache_dtype, "--activations", config.activations]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}  # compiles only: no thread pool to spare
    return subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(child: subprocess.Popen[bytes]) -> None:
    """End the child (done or not) and reap it."""
    if child.poll() is None:
        child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> None:
    """The child: one greedy token of a one-token prompt (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m pagedattn.engine.compile_helper")
    parser.add_argument("--model", default=None)
    parser.add_argument("--kv-cache-dtype", default="float32")
    parser.add_argument("--activations", default="float32")
    options = parser.parse_args(argv)

    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.sampling_params import SamplingParams

    config = engine_config(
        options.model,
        kv_cache_dtype=options.kv_cache_dtype,
        activations=options.activations,
        num_pages=4,
        speculative="none",
    )
    engine = LLMEngine.from_config(config)
    engine.add_request([min(100, engine.vocab_size - 1)], SamplingParams(max_tokens=1, seed=0))
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    main()
