"""Decode step time with a float32 and a float16 KV cache, the two engines in one process.

    .venv/bin/python benchmarks/kv_dtype_ab.py --batch 1 --prompt-len 512
    .venv/bin/python benchmarks/kv_dtype_ab.py --batch 32 --prompt-len 320

Both engines get the same ``--batch`` greedy requests of ``--prompt-len`` tokens cut from the
novel and run until every request is decoding; then their decode steps alternate, so both see
the same machine phase. Prints the median step of each and the ratio.
"""

from __future__ import annotations

import argparse

import numba

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.bench.kernels import interleaved_median_ms
from pagedattn.engine.llm import LLM
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams

DTYPES = ("float32", "float16")


def decoding_engine(kv_cache_dtype: str, batch: int, prompt_len: int, steps: int) -> LLMEngine:
    """An engine whose ``batch`` requests have all finished their prefill."""
    engine = LLM(
        page_size=16,
        kv_cache_mib=2048,
        max_num_seqs=max(batch, 1),
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=False,
    ).engine
    ids = corpus_token_ids(engine.tokenizer, None, batch * prompt_len)
    params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(ids[i * prompt_len : (i + 1) * prompt_len], params)
    while True:
        engine.step()
        stats = engine.get_stats()
        if stats["last_step_num_seqs"] == batch and stats["last_step_num_tokens"] == batch:
            return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    engines = {dt: decoding_engine(dt, args.batch, args.prompt_len, args.steps) for dt in DTYPES}
    ms = interleaved_median_ms({dt: e.step for dt, e in engines.items()}, args.steps, warmup=0)
    print(
        f"decode step, {args.batch} sequence(s) of {args.prompt_len}-token prompts, "
        f"median of {args.steps}: float32 KV {ms['float32']:.2f} ms, float16 KV "
        f"{ms['float16']:.2f} ms, float16 {ms['float32'] / ms['float16']:.2f}x faster"
    )


if __name__ == "__main__":
    main()
