"""Worker of ``test_cached_kernels.py``: greedy generation with logprobs on the embedded model.

``python -m tests.engine.cached_kernels_worker OUT.json`` writes, for each activation path, the
generated token ids and their logprobs (float32 values as exact float64 JSON numbers), and how
many of the engine's compiled functions Numba compiled and loaded from its cache in this process.
"""

from __future__ import annotations

import json
import sys

import numba

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

PROMPT_TOKENS = 200  # > 64 keys: full online-softmax blocks of the decode attention
MAX_TOKENS = 8


def _cache_counts() -> dict[str, int]:
    """Cache hits and misses summed over every cache=True dispatcher imported from pagedattn."""
    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("pagedattn"):
            continue
        for obj in vars(module).values():
            if isinstance(obj, CPUDispatcher) and obj._cache.__class__.__name__ == "FunctionCache":
                hits += sum(obj.stats.cache_hits.values())
                misses += sum(obj.stats.cache_misses.values())
    return {"hits": hits, "misses": misses}


def main(out_path: str) -> None:
    numba.set_num_threads(1)
    result: dict[str, object] = {}
    for activations in ("float32", "int8"):
        llm = LLM(page_size=16, num_pages=64, activations=activations)
        prompt = corpus_token_ids(llm.engine.tokenizer, None, PROMPT_TOKENS)[:PROMPT_TOKENS]
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        c = out.outputs[0]
        assert c.logprobs is not None
        steps = zip(c.logprobs, c.token_ids, strict=True)
        result[activations] = {
            "token_ids": list(c.token_ids),
            "logprobs": [float(step[t].logprob) for step, t in steps],
        }
    result["cache"] = _cache_counts()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
