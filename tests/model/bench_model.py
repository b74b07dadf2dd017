"""Prefill / decode speed of LlamaModel vs HF transformers on the embedded model, same process.

Run: OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 NUMBA_NUM_THREADS=2 HF_HUB_OFFLINE=1 \
     .venv/bin/python -m tests.model.bench_model [--prompt 512] [--decode 32]
Not a test (timings are never asserted); prints one line per measurement.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.model.paging import PagedSequences


def best_of(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true")
    args = parser.parse_args()
    loaded = load_model(None)
    model = LlamaModel.from_loaded(loaded)
    plain = LlamaModel(loaded.config, loaded.weights)  # float32 BLAS only
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 40000, args.prompt)]
    pages = (args.prompt + args.decode) // 16 + 2

    def ours_prefill() -> PagedSequences:
        state = PagedSequences(model, pages, 16)
        state.step({state.new_sequence(): ids})
        return state

    ours_prefill()  # warm-up (numba compile / cache load)
    t_prefill = best_of(ours_prefill, args.repeats)
    state = ours_prefill()
    start = time.perf_counter()
    for _ in range(args.decode):
        state.step({0: [500]})
    t_decode = (time.perf_counter() - start) / args.decode
    print(
        f"ours prefill {args.prompt} tok: {t_prefill:.3f} s = {args.prompt / t_prefill:.0f} tok/s"
    )
    print(f"ours decode @{args.prompt}: {1000 * t_decode:.1f} ms/token = {1 / t_decode:.1f} tok/s")
    state.model = plain
    start = time.perf_counter()
    for _ in range(args.decode):
        state.step({0: [500]})
    t_plain = (time.perf_counter() - start) / args.decode
    print(f"ours decode, float32 BLAS only: {1000 * t_plain:.1f} ms/token")
    if args.no_hf:
        return
    import torch
    import transformers

    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = loaded.source
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        hf(x)
        h_prefill = best_of(lambda: hf(x), args.repeats)
        result = hf(x, use_cache=True)
        cache = result.cache if getattr(result, "cache", None) is not None else None
        key = "cache" if cache is not None else "past_key_values"
        past = cache if cache is not None else result.past_key_values
        token = torch.tensor([[500]])
        start = time.perf_counter()
        for _ in range(args.decode):
            result = hf(token, use_cache=True, **{key: past})
            past = result.cache if key == "cache" else result.past_key_values
        h_decode = (time.perf_counter() - start) / args.decode
    print(
        f"HF   prefill {args.prompt} tok: {h_prefill:.3f} s = {args.prompt / h_prefill:.0f} tok/s"
    )
    print(f"HF   decode @{args.prompt}: {1000 * h_decode:.1f} ms/token = {1 / h_decode:.1f} tok/s")
    print(f"speed ours/HF: prefill {h_prefill / t_prefill:.2f}x, decode {h_decode / t_decode:.2f}x")


if __name__ == "__main__":
    main()
