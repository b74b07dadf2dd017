"""Perplexity by llama.cpp's ``llama-perplexity`` method, on the real paged path.

``llama-perplexity -c N`` (``tools/perplexity/perplexity.cpp``, ``perplexity()``) cuts the
token ids into non-overlapping chunks of ``N`` tokens, runs each chunk alone from an empty KV
cache, and scores only the second half of each chunk: the logits at positions ``N/2 .. N-2``
against the tokens that follow them, so every scored token sees at least ``N/2`` tokens of
context. When the vocabulary adds a BOS token, the ids start with BOS and the first token of
every chunk is replaced by BOS. The reported figure is ``exp`` of the mean NLL over every
scored token of every chunk. Here each chunk is one ``full`` run of
:func:`pagedattn.eval.perplexity.run_perplexity` (one prefill of the chunk through the pool).
"""

from __future__ import annotations

import time

import numpy as np

from pagedattn.eval.perplexity import PerplexityResult, run_perplexity
from pagedattn.eval.policies import make_policy


def run_chunked_perplexity(
    model: object,
    token_ids: np.ndarray | list[int],
    *,
    chunk_tokens: int = 512,
    page_size: int = 16,
    kv_cache_dtype: str = "float32",
    bos_token_id: int | None = None,
) -> PerplexityResult:
    """Perplexity of ``model`` over the whole chunks of ``token_ids``, as llama-perplexity.

    Args:
        model: a :class:`pagedattn.model.llama.LlamaModel`.
        token_ids: (N,) ints, N >= ``chunk_tokens``; ``N // chunk_tokens`` chunks are scored,
            the remainder is dropped (as llama-perplexity drops it).
        chunk_tokens: llama-perplexity's ``-c``: even, >= 4.
        page_size: tokens per page of the pool.
        kv_cache_dtype: storage dtype of the page pool.
        bos_token_id: None (the vocabulary adds no BOS) or the BOS id that starts every chunk.

    Returns:
        A :class:`PerplexityResult` with ``method="chunks"``, ``policy="full"``, ``tokens`` the
        ids in the scored chunks and ``nll`` the ``chunks * (chunk_tokens/2 - 1)`` scored ones.

    Raises:
        ValueError: ``chunk_tokens`` odd or < 4, or fewer ids than one chunk.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    if chunk_tokens < 4 or chunk_tokens % 2:
        raise ValueError(f"chunk_tokens: expected an even int >= 4, got {chunk_tokens}")
    if ids.ndim != 1 or ids.size < chunk_tokens:
        raise ValueError(
            f"token_ids: expected (N,) with N >= chunk_tokens={chunk_tokens}, got {ids.shape}"
        )
    if bos_token_id is not None:
        ids = np.concatenate([[bos_token_id], ids])
    num_chunks = ids.size // chunk_tokens
    first = chunk_tokens // 2
    policy = make_policy("full", page_size=page_size, budget=None)
    began = time.perf_counter()
    scored, peak = [], 0
    for k in range(num_chunks):
        chunk = ids[k * chunk_tokens : (k + 1) * chunk_tokens].copy()
        if bos_token_id is not None:
            chunk[0] = bos_token_id
        run = run_perplexity(
            model,
            chunk,
            policy,
            page_size=page_size,
            chunk_tokens=chunk_tokens,
            kv_cache_dtype=kv_cache_dtype,
        )
        scored.append(run.nll[first : chunk_tokens - 1])  # logits at positions first .. N-2
        peak = max(peak, run.peak_pages)
    return PerplexityResult(
        policy="full",
        position_mode="absolute",
        budget=None,
        page_size=page_size,
        tokens=num_chunks * chunk_tokens,
        nll=np.concatenate(scored),
        peak_pages=peak,
        sliding_window=None,
        num_sink_tokens=0,
        path="fast",
        seconds=time.perf_counter() - began,
        kv_cache_dtype=kv_cache_dtype,
        page_bytes=run.page_bytes,
        activations=run.activations,
        method="chunks",
        extra={"chunk_tokens": chunk_tokens, "chunks": num_chunks},
    )
