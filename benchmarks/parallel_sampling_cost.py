"""What ``n`` > 1 costs in prompt computation: its completions are child requests that share the
prompt's full pages through the prefix cache.

    .venv/bin/python benchmarks/parallel_sampling_cost.py --context 1000 --n 4

For prefix caching on and off, one engine per run computes one request of ``--context`` prompt
tokens cut from the novel with ``n = 1`` and with ``n = --n``, ``max_tokens=1`` (so every token
the forwards compute is a prompt token). Printed per run: the prompt tokens computed (the sum of
the steps' ``StepReport.num_scheduled_tokens``), the recompute per extra child
(``(computed - context) / (n - 1)``), the prefix-hit tokens, the steps, the peak pages in use
and the seconds until the request finished (wall clock after a warm-up run, not a quiet
measurement).
"""

from __future__ import annotations

import argparse
import time

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams


def one_run(
    args: argparse.Namespace, n: int, prefix_caching: bool, context: int | None = None
) -> dict[str, float]:
    llm = LLM(
        model=args.model, page_size=args.page_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=prefix_caching,
    )  # fmt: skip
    engine = llm.engine
    context = args.context if context is None else context
    ids = corpus_token_ids(engine.tokenizer, None, context)[:context]
    params = SamplingParams(n=n, temperature=1.0, seed=0, max_tokens=1, ignore_eos=True)
    began = time.perf_counter()
    engine.add_request(ids, params)
    computed = hits = steps = peak = 0
    while engine.has_unfinished_requests():
        report = engine.step().report
        computed += report.num_scheduled_tokens
        hits += report.num_prefix_hit_tokens
        peak = max(peak, report.num_pages_used)
        steps += 1
    seconds = time.perf_counter() - began
    llm.close()
    extra = (computed - len(ids)) / (n - 1) if n > 1 else 0.0
    return {
        "prompt": len(ids), "computed": computed, "per_extra_child": extra,
        "hits": hits, "steps": steps, "peak_pages": peak, "seconds": seconds,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path or name; None = embedded")
    parser.add_argument("--context", type=int, default=1000, help="prompt tokens")
    parser.add_argument("--n", type=int, default=4, help="completions of the n > 1 run")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = parser.parse_args()
    one_run(args, 2, True, context=64)  # warm-up: kernels loaded, pages touched once
    print(f"prompt {args.context} tokens, page size {args.page_size}, n = {args.n}")
    print("prefix caching   n  computed  per extra child  hits  steps  peak pages  seconds")
    for prefix_caching in (True, False):
        for n in (1, args.n):
            r = one_run(args, n, prefix_caching)
            print(
                f"{'on' if prefix_caching else 'off':>14}  {n:>2}  {r['computed']:>8.0f}"
                f"  {r['per_extra_child']:>15.1f}  {r['hits']:>4.0f}  {r['steps']:>5.0f}"
                f"  {r['peak_pages']:>10.0f}  {r['seconds']:>7.2f}"
            )


if __name__ == "__main__":
    main()
