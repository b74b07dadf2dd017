"""The int8-activation projections of the embedded model (SmolLM2-135M, Q4_1) on each x86 path
this host can run, one worker process per path, their rounds alternated.

Usage: python benchmarks/int8_paths.py [--rows 1,2,32] [--rounds 9] [--threads 2]

Each worker compiles for the host's CPU with some of its features switched off
(``NUMBA_CPU_FEATURES``), so that only the int8 path differs: ``avx2`` without AVX512BW and
VNNI, ``vnni-ymm`` without AVX512BW, ``zmm`` without VNNI, and the host's own. A path whose
instructions the host lacks is skipped. Prints the median and the best ms of every layer's
q|k|v, o, gate|up and down per row count, and each path's speed relative to ``avx2`` (the best
round is the steadier figure on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

OFF = {  # features switched off for each path (LLVM also drops the features that need them)
    "avx2": ("avx512bw", "avx512vnni", "avxvnni"),
    "vnni-ymm": ("avx512bw",),
    "zmm": ("avx512vnni", "avxvnni"),
    "host": (),
}


def _worker(rows: list[int], threads: int) -> None:
    """Answer each line on stdin with one timed round per row count (ms, space-separated)."""
    import numba

    from pagedattn.engine.llm import LLM
    from pagedattn.model.int8_ir import int8_path
    from pagedattn.model.quantized import qmatmul

    numba.set_num_threads(threads)
    model: Any = LLM(num_pages=8).engine.runner.model
    layers = model.layers
    rng = np.random.default_rng(0)
    inputs = [
        (
            rng.standard_normal((t, layers[0].o.shape[1])).astype(np.float32),
            rng.standard_normal((t, layers[0].down.shape[1])).astype(np.float32),
        )
        for t in rows
    ]

    def once(x: np.ndarray, a: np.ndarray) -> float:
        start = time.perf_counter()
        for layer in layers:
            qmatmul(x, *layer.qkv, activations="int8")
            qmatmul(x, layer.o, activations="int8")
            qmatmul(x, *layer.gate_up, activations="int8")
            qmatmul(a, layer.down, activations="int8")
        return 1e3 * (time.perf_counter() - start)

    for x, a in inputs:
        once(x, a)  # compile, warm up
    print(int8_path(), flush=True)
    for _ in sys.stdin:
        print(" ".join(f"{once(x, a):.3f}" for x, a in inputs), flush=True)


def _features(off: tuple[str, ...]) -> str:
    """The host's feature string with ``off`` switched off, last: LLVM applies the flags in
    order, and switching one off also switches off every feature that needs it."""
    from pagedattn.kernels.target import target_cpu

    flags = [f for f in target_cpu()[1].split(",") if f[1:] not in off]
    return ",".join([*flags, *(f"-{f}" for f in off)])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="1,2,32")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.worker:
        _worker(rows, args.threads)
        return
    command = [sys.executable, __file__, "--worker", "--rows", args.rows]
    workers: dict[str, subprocess.Popen[str]] = {}
    paths: dict[str, str] = {}
    for name, off in OFF.items():
        env = {**os.environ, "NUMBA_CPU_FEATURES": _features(off)} if off else dict(os.environ)
        proc = subprocess.Popen(
            [*command, "--threads", str(args.threads)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        if path in paths.values() or not path:  # the host lacks this path's instructions
            proc.kill()
            continue
        workers[name], paths[name] = proc, path
    if "avx2" not in workers:
        raise SystemExit("int8 activations need a CPU with AVX2")
    times: dict[str, list[list[float]]] = {name: [] for name in workers}
    for _ in range(args.rounds):
        for name, proc in workers.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            times[name].append([float(v) for v in proc.stdout.readline().split()])
    for proc in workers.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"ms of all projections per call, {args.threads} threads, {args.rounds} rounds:")
    for label, pick in (("median", statistics.median), ("best", min)):
        print(f"{label:>9} " + " ".join(f"{f'T={t} ms':>9} {'vs avx2':>8}" for t in rows))
        base = [pick(r[i] for r in times["avx2"]) for i in range(len(rows))]
        for name, rounds in times.items():
            ms = [pick(r[i] for r in rounds) for i in range(len(rows))]
            cells = " ".join(f"{m:>9.2f} {b / m:>7.2f}x" for m, b in zip(ms, base, strict=True))
            print(f"{paths[name]:>9} {cells}")


if __name__ == "__main__":
    main()
