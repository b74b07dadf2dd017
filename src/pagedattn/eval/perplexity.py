"""Perplexity of a model over a long text under a KV eviction policy, on the real paged path.

Method (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453, Sec. 4.1): the tokens are fed one at
a time through the paged KV cache, the negative log-likelihood of the next token is recorded,
and the policy runs after each step. The model is :class:`pagedattn.model.llama.LlamaModel`
driven by :class:`ForwardBatch` over a page pool, as serving runs it.

Fast path (``fast=True``) for policies that do not read attention scores: the same tokens in
chunks (chunked prefill). Evicting policies take one page-aligned page per chunk: a
``window`` / ``sinks`` policy needs the same pages for every query of an aligned page (its
first needed page moves only at page boundaries) and ``random`` evicts only when a token opens
a page, so the resident pages, the visible keys and the eviction decisions are those of the
token-by-token path; ``full`` evicts nothing and takes ``chunk_tokens`` tokens per chunk.

On a model whose layers keep their own sliding windows (Gemma 3), every layer group has its own
page table (:mod:`pagedattn.eval.group_tables`): the policy acts on the full-attention layers'
pages, each sliding group keeps what the smaller of its window and the policy's sees, and the
result's ``kv_groups`` says each group's peak resident pages and K/V bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedattn.eval.group_tables import GroupedSequence, is_hybrid
from pagedattn.eval.policies import EvictionPolicy
from pagedattn.model.forward_batch import ForwardBatch


@dataclass
class PerplexityResult:
    """One run: ``nll[t]`` is -log p(token t+1 | tokens <= t, under the policy), natural log."""

    policy: str
    position_mode: str
    budget: int | None
    page_size: int
    tokens: int
    nll: np.ndarray  # (tokens - 1,) float64
    peak_pages: int
    sliding_window: int | None
    num_sink_tokens: int
    path: str  # "fast" (chunked prefill) or "token" (one token per step)
    seconds: float
    kv_cache_dtype: str = "float32"
    page_bytes: int = 0  # one page of the pool (every layer's K and V)
    activations: str = "float32"  # the model's matmul inputs (``int8``: llama.cpp's arithmetic)
    method: str = "stream"  # "stream" (every next token) or "chunks" (see ``eval.chunks``)
    extra: dict[str, Any] = field(default_factory=dict)
    # With ``trace=True``: (first position, token count, resident logical pages) per forward.
    resident_log: list[tuple[int, int, list[int]]] | None = None

    @property
    def mean_nll(self) -> float:
        return float(self.nll.mean())

    @property
    def perplexity(self) -> float:
        """``exp(mean NLL)`` over the ``tokens - 1`` predicted tokens."""
        return math.exp(self.mean_nll)

    def record(self) -> dict[str, Any]:
        """JSON-ready record (the running mean NLL is sampled at 64 points)."""
        n = self.nll.size
        idx = np.unique(np.linspace(1, n, num=min(64, n), dtype=np.int64))
        running = np.cumsum(self.nll)[idx - 1] / idx
        return {
            "policy": self.policy,
            "position_mode": self.position_mode,
            "budget": self.budget,
            "kv_cache_dtype": self.kv_cache_dtype,
            "page_bytes": self.page_bytes,
            "activations": self.activations,
            "method": self.method,
            "tokens": self.tokens,
            "perplexity": self.perplexity,
            "mean_nll": self.mean_nll,
            "page_size": self.page_size,
            "peak_pages": self.peak_pages,
            "peak_kv_tokens": self.peak_pages * self.page_size,
            "sliding_window": self.sliding_window,
            "num_sink_tokens": self.num_sink_tokens,
            "path": self.path,
            "seconds": self.seconds,
            "running_mean_nll": {"position": idx.tolist(), "value": running.tolist()},
            **self.extra,
        }


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(rows,) float64 -log softmax(logits)[target] of (rows, vocab) float32 logits."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    out: np.ndarray = lse - x[np.arange(x.shape[0]), targets]
    return out


def _sink_positions(policy: EvictionPolicy, pos: np.ndarray) -> np.ndarray | None:
    """In-cache query positions against sink keys (shifted mode), as the model runner does."""
    window = policy.sliding_window
    if policy.position_mode != "shifted" or policy.num_sink_tokens == 0 or window is None:
        return None
    out: np.ndarray = np.minimum(pos, policy.num_sink_tokens + window - 1)
    return out


def check_policy_for_model(model: Any, policy: EvictionPolicy) -> None:
    """Refuse what the lab cannot run per layer group on a hybrid model.

    Raises:
        ValueError: a policy that reads attention scores (``h2o``: its mass is summed over
            one page table of every layer), or ``shifted`` positions (defined for one window),
            on a model whose layers keep their own sliding windows.
    """
    if not is_hybrid(model):
        return
    windows = sorted({w for w in model.config.layer_windows or () if w})
    if policy.needs_attention:
        raise ValueError(
            f"policy: {policy.name!r} reads attention scores over one page table of every "
            f"layer; a model whose layers keep their own sliding windows ({windows}) runs "
            f"full, window, sinks or random"
        )
    if policy.position_mode == "shifted":
        raise ValueError(
            f"position_mode: 'shifted' ({policy.name}) counts positions inside one window; a "
            f"model whose layers keep their own sliding windows ({windows}) runs 'absolute'"
        )


def run_perplexity(
    model: Any,
    token_ids: np.ndarray | list[int],
    policy: EvictionPolicy,
    *,
    page_size: int,
    budget: int | None = None,
    fast: bool = True,
    chunk_tokens: int = 256,
    trace: bool = False,
    kv_cache_dtype: str = "float32",
) -> PerplexityResult:
    """Perplexity of ``model`` over ``token_ids`` with ``policy`` managing the KV pages.

    Args:
        model: a :class:`pagedattn.model.llama.LlamaModel` (``forward``, ``kv_shape``).
        token_ids: (N,) ints, N >= 2; all N - 1 next tokens are scored.
        policy: from :func:`pagedattn.eval.policies.make_policy` (the same ``page_size``).
        page_size: tokens per page.
        budget: the budget the policy was built with (reported only).
        fast: chunked prefill where the policy allows it (``needs_attention`` policies always
            run token by token).
        chunk_tokens: chunk length of the fast path for a policy without a page budget.
        trace: also log the resident pages of every forward (``resident_log``).
        kv_cache_dtype: storage dtype of the page pool (``KV_CACHE_DTYPES``).

    Returns:
        A :class:`PerplexityResult`.

    Raises:
        ValueError: fewer than 2 tokens, a non-positive ``page_size`` / ``chunk_tokens``, or
            an unknown ``kv_cache_dtype``.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"token_ids: expected (N,) with N >= 2, got shape {ids.shape}")
    if page_size < 1 or chunk_tokens < 1:
        raise ValueError(f"page_size, chunk_tokens: expected >= 1, got {page_size}, {chunk_tokens}")
    n = ids.size - 1  # tokens fed (the last one is only a target)
    total_pages = -(-n // page_size)
    max_pages = total_pages if policy.max_pages is None else min(policy.max_pages, total_pages)
    check_policy_for_model(model, policy)
    token_by_token = policy.needs_attention or not fast
    fast_chunk = chunk_tokens if policy.max_pages is None else page_size
    chunk = 1 if token_by_token else fast_chunk
    seq = GroupedSequence(
        model, n, page_size, max_pages, kv_cache_dtype, policy_window=policy.sliding_window,
        num_sink_tokens=policy.num_sink_tokens, step_tokens=chunk,
    )  # fmt: skip
    table = seq.policy_table
    nll = np.empty(n, np.float64)
    mass = np.zeros(table.table.shape[1], np.float64) if policy.needs_attention else None
    log: list[tuple[int, int, list[int]]] | None = [] if trace else None
    began = time.perf_counter()
    start = 0
    while start < n:
        count = min(chunk, n - start)
        slots = seq.slots(start, count)
        if log is not None:
            log.append((start, count, table.resident()))
        pos = np.arange(start, start + count, dtype=np.int64)
        batch = ForwardBatch(
            input_ids=ids[start : start + count],
            positions=pos,
            query_start_loc=np.asarray([0, count], np.int32),
            context_lens=np.asarray([start + count], np.int32),
            logits_indices=np.arange(count, dtype=np.int64),
            sliding_window=policy.sliding_window,
            num_sink_tokens=policy.num_sink_tokens,
            sink_positions=_sink_positions(policy, pos),
            **seq.batch_fields(slots),
        )
        if mass is not None:
            step_mass = np.zeros(table.table.shape, np.float32)
            logits = model.forward(batch, seq.kv, attention_mass=step_mass)
            mass += step_mass[0]
        else:
            logits = model.forward(batch, seq.kv)
        nll[start : start + count] = _nll(logits, ids[start + 1 : start + count + 1])
        start += count
        table.evict_all_but(policy.keep(table.resident(), start, mass))
        seq.evict_windows(start)
        if mass is not None:
            mass[table.table[0] < 0] = 0.0  # an evicted page's history leaves with it
    extra: dict[str, Any] = {}
    if seq.layer_groups is not None:
        extra["kv_groups"] = seq.group_peaks()
    return PerplexityResult(
        policy=policy.name,
        position_mode=policy.position_mode,
        budget=budget if policy.max_pages is not None else None,
        page_size=page_size,
        tokens=int(ids.size),
        nll=nll,
        peak_pages=table.peak,
        sliding_window=policy.sliding_window,
        num_sink_tokens=policy.num_sink_tokens,
        path="token" if token_by_token else "fast",
        seconds=time.perf_counter() - began,
        kv_cache_dtype=kv_cache_dtype,
        page_bytes=seq.page_layer_bytes * model.config.num_layers,
        activations=str(getattr(model, "activations", "float32")),
        extra=extra,
        resident_log=log,
    )
