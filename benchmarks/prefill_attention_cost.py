"""The context length at which a prompt token's attention costs as much as the rest of its work
(``prefill_attention_tokens``), measured on a model and this machine.

    .venv/bin/python benchmarks/prefill_attention_cost.py [--model PATH] [--context 4096]
        [--chunk 256] [--reps 6]

Times the forward of a ``--chunk``-token prompt piece with no context before it, and of the
same size of piece after ``--context`` tokens served from the prefix cache, alternately, and
takes their medians ``t0`` and ``t1``. A piece of ``c`` tokens at position ``s`` costs about
``c * (a + b * (s + c / 2))`` (matmuls plus attention), so ``r = t1 / t0`` gives
``a / b = (context + c/2 - r * c/2) / (r - 1)``: the engine option's value for this setup.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams


def forward_s(engine: LLMEngine, prompt: list[int], chunk: int) -> float:
    """Seconds of the forward that computed the ``chunk``-token piece of ``prompt``."""
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0))
    took = []
    while engine.has_unfinished_requests():
        report = engine.step().report
        if report.num_scheduled_tokens == chunk:
            took.append(report.timings.run.forward_s)
    if not took:
        raise SystemExit(f"no step computed a {chunk}-token piece (context not page-aligned?)")
    return took[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    c, s = args.chunk, args.context
    engine = LLMEngine.from_config(
        engine_config(
            args.model,
            kv_cache_mib=512,
            max_num_batched_tokens=max(2048, s),
            long_prefill_token_threshold=max(2048, s),  # the context in one piece, then the chunk
            prefill_attention_tokens=None,
        )
    )
    rng = np.random.default_rng(0)
    context = rng.integers(100, 1000, s).tolist()  # ids every vocabulary has
    forward_s(engine, [*context, *rng.integers(100, 1000, c).tolist()], c)  # caches the context
    alone, after = [], []
    for _ in range(args.reps):
        piece = rng.integers(100, 1000, c).tolist()
        alone.append(forward_s(engine, piece, c))
        after.append(forward_s(engine, [*context, *piece], c))
    t0, t1 = statistics.median(alone), statistics.median(after)
    r = t1 / t0
    print(
        f"{c} tokens at position 0: {t0 * 1e3:.0f} ms; at position {s}: {t1 * 1e3:.0f} ms "
        f"(medians of {args.reps}); prefill_attention_tokens ~ "
        f"{(s + c / 2 - r * c / 2) / (r - 1):.0f}"
    )


if __name__ == "__main__":
    main()
