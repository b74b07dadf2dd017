"""`bench engine`: offline throughput of many requests on our engine.

It runs in a process of its own (:mod:`pagedattn.bench.worker`), as does every peer a
comparison measures beside it; this is our side's measurement: every request is queued at
once and the engine's continuous batching (vLLM-style scheduler, Kwon et al. 2023, arXiv
2309.06180) runs them to completion; the wall time from the first ``add_request`` to the last
finished request is the elapsed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

Progress = Callable[[str, int, int], None]


def run_offline(
    engine: Any, prompts: Sequence[Sequence[int]], params: Any, phase: str, progress: Progress
) -> dict[str, float]:
    """Queue every prompt, step until all finish; return throughput figures.

    Returns:
        ``{"elapsed_s", "generated_tok_s", "requests_s", "generated", "cached_tokens",
        "prompt_tokens", "preemptions"}`` (counts are over this run only).

    Raises:
        RuntimeError: a request was rejected (its error).
    """
    before = engine.get_stats()
    start = time.perf_counter()
    for p in prompts:
        engine.add_request(list(p), params)
    generated = cached = done = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            generated += sum(len(c.token_ids) for c in out.outputs)
            if out.finished:
                if out.error:
                    raise RuntimeError(f"request rejected: {out.error}")
                cached += out.num_cached_tokens
                done += 1
                progress(phase, done, len(prompts))
    elapsed = time.perf_counter() - start
    after = engine.get_stats()
    return {
        "elapsed_s": elapsed,
        "generated_tok_s": generated / elapsed,
        "requests_s": len(prompts) / elapsed,
        "generated": generated,
        "cached_tokens": cached,
        "prompt_tokens": sum(len(p) for p in prompts),
        "preemptions": after["num_preemptions"] - before["num_preemptions"],
    }


def measure_ours(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Our engine: the distinct prompts, then the shared-prefix prompts with prefix caching on
    and off (one engine each, all on one loaded model).

    Args (JSON): ``model``, ``prompts``, ``shared_prompts`` (may be empty: skipped),
        ``output_len``, ``kv_cache_mib``, ``max_num_seqs``, ``page_size``, ``threads``,
        ``backend`` / ``device`` (default numpy).
    """
    import gc

    import numba

    from pagedattn.bench.worker import worker_model
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.model.loader import load_model
    from pagedattn.sampling_params import SamplingParams

    numba.set_num_threads(int(args["threads"]))
    loaded = load_model(args.get("model"))
    model = worker_model(loaded, args)  # numpy: projections on the GGUF blocks

    def engine(prefix_caching: bool) -> LLMEngine:
        config = engine_config(
            args.get("model"),
            page_size=int(args["page_size"]),
            kv_cache_mib=float(args["kv_cache_mib"]),
            max_num_seqs=int(args["max_num_seqs"]),
            enable_prefix_caching=prefix_caching,
            backend=args.get("backend", "numpy"),
            device=args.get("device"),
            activations=args.get("activations", "float32"),
            kv_cache_dtype=args.get("kv_cache_dtype", "float32"),
            speculative=args.get("speculative", "none"),
        )
        return LLMEngine(config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint)

    params = SamplingParams(temperature=0.0, max_tokens=int(args["output_len"]), ignore_eos=True)
    warm = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    prompts, shared = args["prompts"], args["shared_prompts"]

    def run(prefix_caching: bool, batch: list[list[int]], p: Any, phase: str) -> dict[str, Any]:
        eng = engine(prefix_caching)
        figures = run_offline(eng, batch, p, phase, progress)
        figures["num_pages"] = eng.page_pool.num_pages  # what --kv-cache-mib holds
        del eng
        # The engine's pool is freed before the next one is allocated (reference cycles would
        # keep it until a later collection): the peak RSS is one engine's, not the sum.
        gc.collect()
        return figures

    # Warm-up (kernel compilation) on its own engine, so it leaves nothing in the prefix cache.
    run(False, [prompts[0][:20], prompts[-1][:28]], warm, "warm-up")
    result: dict[str, Any] = {"main": run(True, prompts, params, "ours")}
    if shared:
        for flag, name in ((True, "shared_on"), (False, "shared_off")):
            phase = f"ours shared prefix, caching {'on' if flag else 'off'}"
            result[name] = run(flag, shared, params, phase)
    return result
