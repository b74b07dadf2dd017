"""Sampler: one token id per logits row, with per-row SamplingParams and random generators.

Greedy rows take the exact argmax of the float32 logits. Other rows are sampled from
``softmax(logits / temperature)`` computed in float64 with max subtraction (so tiny temperatures
never produce NaN), restricted first by top-k, then by top-p (nucleus, Holtzman et al. 2019,
arXiv 1904.09751), the order vLLM and HF transformers use. Each row draws exactly one uniform
number from its own generator, so a seeded request's tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pagedattn.sampling_params import SamplingParams


def make_generator(seed: int) -> np.random.Generator:
    """The per-request random generator: ``np.random.Generator(PCG64(seed))``."""
    return np.random.Generator(np.random.PCG64(seed))


def sampling_probs(logits: npt.NDArray[np.floating], params: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy row samples from.

    Args:
        logits: (vocab,) float logits of one row.
        params: its sampling parameters; ``temperature > 0``.

    Returns:
        (vocab,) float64 probabilities summing to 1, zero outside the top-k / top-p support.

    Raises:
        ValueError: logits not 1-D, or a greedy ``params`` (temperature 0).
    """
    if logits.ndim != 1:
        raise ValueError(f"logits: expected shape (vocab,), got {logits.shape}")
    if params.greedy:
        raise ValueError("sampling_probs: temperature 0 is greedy, use argmax")
    x = logits.astype(np.float64)
    # Subtract the max before dividing: (x - max) / T <= 0, so even T = 5e-324 gives -inf at
    # worst (exp -> 0), never inf - inf = NaN.
    with np.errstate(over="ignore"):
        x = (x - x.max()) / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        # Exactly top_k survivors (ties broken by argpartition's order).
        keep = np.argpartition(-x, params.top_k - 1)[: params.top_k]
        masked = np.full_like(x, -np.inf)
        masked[keep] = x[keep]
        x = masked
    p = np.exp(x - x.max())
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        # Keep a token while the mass strictly before it is < top_p: the smallest prefix whose
        # mass reaches top_p (always at least one token).
        mass_before = np.cumsum(sorted_p) - sorted_p
        drop = order[mass_before >= params.top_p]
        p[drop] = 0.0
        p /= p.sum()
    return np.asarray(p, dtype=np.float64)


def sample(
    logits: npt.NDArray[np.floating],
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator],
    output_token_ids: Sequence[Sequence[int]] | None = None,
    num_valid_tokens: int | None = None,
) -> npt.NDArray[np.int64]:
    """Pick one token per row.

    Args:
        logits: (num_rows, vocab) float32 (or float64) logits.
        params: one SamplingParams per row.
        generators: one random generator per row (only non-greedy rows draw from it, one
            uniform number each).
        output_token_ids: per row, the tokens its request generated so far (what its
            ``logits_processors`` see); None = no row has processors.
        num_valid_tokens: ids at or above this are never picked (padded embedding rows the
            tokenizer has no token for), also after the logits processors; None = all.

    Returns:
        (num_rows,) int64 token ids.

    Raises:
        ValueError: logits not 2-D, ``params``/``generators`` lengths differ from num_rows,
            or a row that cannot be sampled (see :func:`sample_each`).
    """
    ids, errors = sample_each(logits, params, generators, output_token_ids, num_valid_tokens)
    if errors:
        row, message = min(errors.items())
        raise ValueError(f"logits row {row}: {message}")
    return ids


def sample_each(
    logits: npt.NDArray[np.floating],
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator],
    output_token_ids: Sequence[Sequence[int]] | None = None,
    num_valid_tokens: int | None = None,
) -> tuple[npt.NDArray[np.int64], dict[int, str]]:
    """Like :func:`sample`, but a row that fails (NaN or +inf logits, every id masked, a
    logits processor raising) fails alone.

    Returns:
        ``(token_ids, errors)``: (num_rows,) int64 ids (-1 in failed rows) and row -> message.

    Raises:
        ValueError: logits not 2-D, or ``params``/``generators`` lengths differ from num_rows.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits: expected shape (num_rows, vocab), got {logits.shape}")
    n = logits.shape[0]
    if len(params) != n or len(generators) != n:
        raise ValueError(
            f"params, generators: expected {n} entries each, got {len(params)}, {len(generators)}"
        )
    if params and any(p.logits_processors for p in params) and output_token_ids is None:
        raise ValueError("output_token_ids: needed by rows with logits_processors")
    out = np.full(n, -1, dtype=np.int64)
    errors: dict[int, str] = {}
    for i, (row_params, gen) in enumerate(zip(params, generators, strict=True)):
        try:
            history = output_token_ids[i] if output_token_ids is not None else ()
            out[i] = _sample_row(logits[i], row_params, gen, history, num_valid_tokens)
        except Exception as exc:  # one request's row: it fails alone
            errors[i] = f"{type(exc).__name__}: {exc}"
    return out, errors


def _sample_row(
    row: npt.NDArray[np.floating],
    params: SamplingParams,
    gen: np.random.Generator,
    history: Sequence[int],
    num_valid_tokens: int | None,
) -> int:
    for proc in params.logits_processors:
        row = proc(history, row.copy())
    if num_valid_tokens is not None and num_valid_tokens < row.shape[0]:
        row = row.copy()
        row[num_valid_tokens:] = -np.inf
    if np.isnan(row).any() or np.isposinf(row).any():
        raise ValueError("the logits row holds NaN or +inf")
    if not np.isfinite(row).any():
        raise ValueError("every token id is masked (all logits are -inf)")
    if params.greedy:
        return int(np.argmax(row))
    p = sampling_probs(row, params)
    cdf = np.cumsum(p)
    u = gen.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    # cdf[idx - 1] <= u < cdf[idx] picks a token with p > 0; u rounding up to cdf[-1]
    # falls back to the last token in the support.
    return min(idx, int(np.flatnonzero(p)[-1]))
