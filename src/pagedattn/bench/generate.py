"""`bench generate`: single-stream prefill and decode speed of our engine.

It runs in a process of its own (:mod:`pagedattn.bench.worker`), as does every peer a
comparison measures beside it; this is our side's measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pagedattn.engine.outputs import RequestOutput

Progress = Callable[[str, int, int], None]


def run_one(engine: Any, prompt_ids: Sequence[int], params: Any) -> RequestOutput:
    """Run one request alone on an idle engine; return its final output (with metrics).

    Raises:
        RuntimeError: the engine rejected the request (its error message).
    """
    from pagedattn.engine.outputs import merge_delta

    request_id = engine.add_request(list(prompt_ids), params)
    results: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id:
                merge_delta(results, out)
    final = results.get(request_id)
    if final is None or not final.finished or final.error:
        raise RuntimeError(f"request failed: {None if final is None else final.error}")
    return final


def measure_ours(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Our engine on one stream: prefill of the prompt and decode after it.

    Args (JSON): ``model`` (path or None), ``prompt_ids``, ``output_len``, ``repeats``,
        ``threads``, ``page_size``, ``backend`` / ``device`` (default numpy). Prefix caching is
        off so every repeat computes the prompt.

    Method: prefill = median over ``repeats`` requests of (first token - first scheduled) with
    ``max_tokens=1``; decode = (output_len - 1) / (last token - first token) of one greedy
    request with ``ignore_eos`` (after one warm-up request that compiles the kernels).
    """
    import numba
    import numpy as np

    from pagedattn.bench.worker import resident_mib, worker_model
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.model.loader import load_model
    from pagedattn.sampling_params import SamplingParams

    numba.set_num_threads(int(args["threads"]))
    prompt, output_len, repeats = list(args["prompt_ids"]), int(args["output_len"]), args["repeats"]
    config = engine_config(
        args.get("model"),
        page_size=int(args.get("page_size", 16)),
        enable_prefix_caching=False,
        backend=args.get("backend", "numpy"),
        device=args.get("device"),
        activations=args.get("activations", "float32"),
        kv_cache_dtype=args.get("kv_cache_dtype", "float32"),
        speculative=args.get("speculative", "none"),
    )
    loaded = load_model(args.get("model"))
    model = worker_model(loaded, args)  # numpy: projections on the GGUF blocks
    engine = LLMEngine(config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint)
    total = repeats + 2
    run_one(engine, prompt[:32], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    progress("ours warm-up", 1, total)
    times = []
    for i in range(repeats):
        m = run_one(engine, prompt, SamplingParams(temperature=0.0, max_tokens=1)).metrics
        assert m.first_token_time is not None and m.first_scheduled_time is not None
        times.append(m.first_token_time - m.first_scheduled_time)
        progress("ours prefill", i + 2, total)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    out = run_one(engine, prompt, params)
    m = out.metrics
    assert m.first_token_time is not None and m.last_token_time is not None
    progress("ours decode", total, total)
    generated = len(out.outputs[0].token_ids)
    prefill_s = statistics.median(times)
    # fidelity (not timed): the first generated position's top logprobs
    first = run_one(engine, prompt, SamplingParams(temperature=0.0, max_tokens=1, logprobs=20))
    assert first.outputs[0].logprobs is not None
    first_logprobs = {str(t): lp.logprob for t, lp in first.outputs[0].logprobs[0].items()}
    pool = engine.page_pool.kv
    return {
        "prefill_tok_s": len(prompt) / prefill_s,
        "decode_tok_s": (generated - 1) / (m.last_token_time - m.first_token_time),
        "prefill_s": prefill_s,
        "generated": generated,
        "greedy_ids": list(out.outputs[0].token_ids),
        "first_logprobs": first_logprobs,
        # the pages of the pool this run touched (a NumPy pool is allocated lazily)
        "kv_cache_mib": resident_mib(pool) if isinstance(pool, np.ndarray) else None,
    }
