"""The engine alone at concurrency 1: what the server's inter-token latency is measured against.

Runs the load generator's chat questions (``load.py``'s ``QUESTIONS``, rendered by the model's
chat template) one at a time through an ``LLMEngine`` in this process, greedy, ``ignore_eos``,
``--max-tokens`` each, and prints one JSON object: the inter-token latency p50 / mean (the gap
between consecutive decode steps of a request, as the load generator times content chunks) and
the output tok/s over the run. ``compare.py`` runs it, alone on the cores, before the servers.

Usage::

    python benchmarks/online/engine_itl.py --num-requests 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from load import QUESTIONS

from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams


def engine_itl(
    model: str | None, num_requests: int, max_tokens: int, **options: str
) -> dict[str, float]:
    """One warm-up request, then ``num_requests`` chats one at a time; the figures."""
    engine = LLMEngine.from_config(engine_config(model, **options))
    tokenizer = engine.tokenizer
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = {"temperature": 0.0, "ignore_eos": True}
    engine.add_request(prompts[0], SamplingParams(max_tokens=4, **greedy), "warm-up")
    while engine.has_unfinished_requests():
        engine.step()
    gaps: list[float] = []
    tokens = 0
    start = time.perf_counter()
    for i in range(num_requests):
        params = SamplingParams(max_tokens=max_tokens, **greedy)
        engine.add_request(prompts[i % len(prompts)], params, f"r{i}")
        ends = []
        while engine.has_unfinished_requests():
            outputs = engine.step()
            ends.append(time.perf_counter())
            tokens += sum(len(c.token_ids) for out in outputs for c in out.outputs)
        gaps += np.diff(ends).tolist()  # the first step is the prefill: TTFT, not a gap
    wall = time.perf_counter() - start
    return {
        "itl_p50_ms": float(np.percentile(gaps, 50)) * 1000,
        "itl_mean_ms": float(np.mean(gaps)) * 1000,
        "output_tok_s": tokens / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--activations", default="float32", choices=["float32", "int8"])
    ap.add_argument("--kv-cache-dtype", default="float32")
    args = ap.parse_args()
    figures = engine_itl(
        args.model,
        args.num_requests,
        args.max_tokens,
        activations=args.activations,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
