"""Projection throughput: every layer's q|k|v, o, gate|up and down of the embedded model
(SmolLM2-135M, Q4_1 blocks, memory-mapped) on T activation rows, ours against torch's float32
GEMM on the same shapes, alternated in one process.

Usage: python benchmarks/matmul_rate.py [--rows 1,32,512] [--rounds 7] [--threads 2]

Rows 1 and 2 take the in-register decode kernel (decode steps), more rows the tiled kernel
(prefill, batched decode); ``--activations int8`` is timed too. torch needs the test extra
(pinned torch==2.13.0).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numba
import numpy as np


def _measure(
    rows: int, model: Any, torch_weights: list[list[Any]], rounds: int, rng: np.random.Generator
) -> dict[str, float]:
    """Median ms of every projection of every layer on ``rows`` rows: ours (float32, int8)
    and torch, alternated each round."""
    import torch

    from pagedattn.bench.kernels import interleaved_median_ms
    from pagedattn.model.quantized import qmatmul

    layers = model.layers
    x = rng.standard_normal((rows, layers[0].o.shape[1])).astype(np.float32)
    a = rng.standard_normal((rows, layers[0].down.shape[1])).astype(np.float32)
    tx, ta = torch.from_numpy(x), torch.from_numpy(a)

    def ours(activations: str) -> None:
        for layer in layers:
            qmatmul(x, *layer.qkv, activations=activations)
            qmatmul(x, layer.o, activations=activations)
            qmatmul(x, *layer.gate_up, activations=activations)
            qmatmul(a, layer.down, activations=activations)

    def reference() -> None:
        with torch.inference_mode():
            for q, k, v, o, g, u, d in torch_weights:
                tx @ q.T, tx @ k.T, tx @ v.T, tx @ o.T, tx @ g.T, tx @ u.T, ta @ d.T

    runs: dict[str, Callable[[], None]] = {
        "ours": lambda: ours("float32"),
        "int8": lambda: ours("int8"),
        "torch": reference,
    }
    return interleaved_median_ms(runs, rounds)  # one untimed call each: compile, warm up


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="1,32,512")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from pagedattn.engine.llm import LLM

    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    model = LLM(num_pages=8).engine.runner.model
    first = model.layers[0]
    shapes = [w.shape for w in (*first.qkv, first.o, *first.gate_up, first.down)]
    flops_per_row = 2 * len(model.layers) * sum(n * k for n, k in shapes)
    gen = torch.Generator().manual_seed(0)
    torch_weights = [[torch.randn(n, k, generator=gen) for n, k in shapes] for _ in model.layers]
    rng = np.random.default_rng(0)
    print(f"{len(model.layers)} layers, projections {shapes}, {args.threads} threads")
    print(f"{'rows':>5} {'ours ms':>9} {'int8 ms':>9} {'torch ms':>9} {'ours GFLOP/s':>13} "
          f"{'torch GFLOP/s':>14} {'ours/torch':>11}")  # fmt: skip
    for rows in (int(r) for r in args.rows.split(",")):
        ms = _measure(rows, model, torch_weights, args.rounds, rng)
        gflops = {name: flops_per_row * rows / value / 1e6 for name, value in ms.items()}
        print(f"{rows:>5} {ms['ours']:>9.2f} {ms['int8']:>9.2f} {ms['torch']:>9.2f} "
              f"{gflops['ours']:>13.1f} {gflops['torch']:>14.1f} "
              f"{ms['torch'] / ms['ours']:>10.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
