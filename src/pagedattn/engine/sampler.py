"""Sampler: one token id per logits row, with per-row SamplingParams and random generators.

Each row first goes through :func:`pagedattn.engine.penalties.apply_logits_processing`
(logits processors, min_tokens, logit_bias, penalties). Greedy rows then take the exact argmax.
Other rows are sampled from ``softmax(logits / temperature)`` computed in float64 with max
subtraction (so tiny temperatures never produce NaN), restricted by min-p (Nguyen et al. 2024,
arXiv 2407.01082), then top-k, then top-p (nucleus, Holtzman et al. 2019, arXiv 1904.09751), the
order of vLLM v1's sampler. Each row draws exactly one uniform number from its own generator, so
a seeded request's tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pagedattn.engine.outputs import DeadEndError
from pagedattn.engine.penalties import apply_logits_processing, needs_processing
from pagedattn.sampling_params import SamplingParams


def mask_padded_vocab(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """Set the logits of ids >= ``vocab_size`` (padded embedding rows past the tokenizer's
    vocabulary) to -inf, in place, so they are never sampled nor listed in logprobs.

    Args:
        logits: (num_rows, model_vocab) float logits.
        vocab_size: the tokenizer's vocabulary size.

    Returns:
        ``logits`` itself.
    """
    if logits.shape[-1] > vocab_size:
        logits[..., vocab_size:] = -np.inf
    return logits


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
    with np.errstate(over="ignore", invalid="ignore"):
        x = (x - x.max()) / params.temperature
    x[np.isnan(x)] = -np.inf  # -inf - max (masked ids)
    vocab = x.shape[0]
    if params.min_p > 0.0:
        # p_j / p_max = exp(x_j - x_max) = exp(x_j) (x_max = 0): keep p_j >= min_p * p_max.
        with np.errstate(divide="ignore"):
            x[x < np.log(params.min_p)] = -np.inf
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
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_ids: Sequence[int] = (),
) -> npt.NDArray[np.int64]:
    """Pick one token per row.

    Args:
        logits: (num_rows, vocab) float32 (or float64) logits; padded ids already masked
            (:func:`mask_padded_vocab`).
        params: one SamplingParams per row.
        generators: one random generator per row (only non-greedy rows draw from it, one
            uniform number each).
        output_token_ids: per row, the tokens its request generated so far (what its
            ``logits_processors``, min_tokens and penalties see); None = no row needs them.
        prompt_token_ids: per row, its prompt (the repetition penalty sees it); None = no row
            has a repetition penalty.
        eos_token_ids: ids masked while a row's ``min_tokens`` is not reached.

    Returns:
        (num_rows,) int64 token ids.

    Raises:
        ValueError: logits not 2-D, ``params``/``generators`` lengths differ from num_rows,
            or a row that cannot be sampled (see :func:`sample_each`).
    """
    ids, errors = sample_each(
        logits, params, generators, output_token_ids, prompt_token_ids, eos_token_ids
    )
    if errors:
        row, message = min(errors.items())
        raise ValueError(f"logits row {row}: {message}")
    return ids


def sample_each(
    logits: npt.NDArray[np.floating],
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator],
    output_token_ids: Sequence[Sequence[int]] | None = None,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_ids: Sequence[int] = (),
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
    out = np.full(n, -1, dtype=np.int64)
    errors: dict[int, str] = {}
    for i, (row_params, gen) in enumerate(zip(params, generators, strict=True)):
        try:
            row = logits[i]
            if needs_processing(row_params):
                if output_token_ids is None:
                    raise ValueError("output_token_ids: needed by rows with logits processing")
                if prompt_token_ids is None and row_params.repetition_penalty != 1.0:
                    raise ValueError("prompt_token_ids: needed by rows with a repetition_penalty")
                prompt = () if prompt_token_ids is None else prompt_token_ids[i]
                row = apply_logits_processing(
                    row, row_params, prompt, output_token_ids[i], eos_token_ids
                )
            out[i] = _sample_row(row, row_params, gen)
        except Exception as exc:  # one request's row: it fails alone
            errors[i] = f"{type(exc).__name__}: {exc}"
    return out, errors


def _sample_row(
    row: npt.NDArray[np.floating], params: SamplingParams, gen: np.random.Generator
) -> int:
    # One pass: argmax stops at the first NaN, and a +inf or an all -inf row is its maximum.
    best = int(np.argmax(row))
    top = row[best]
    if np.isnan(top) or top == np.inf:
        raise ValueError("the logits row holds NaN or +inf")
    if top == -np.inf:
        raise DeadEndError("every token id is masked (all logits are -inf)")
    if params.greedy:
        return best
    p = sampling_probs(row, params)
    cdf = np.cumsum(p)
    u = gen.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    # cdf[idx - 1] <= u < cdf[idx] picks a token with p > 0; u rounding up to cdf[-1]
    # falls back to the last token in the support.
    return min(idx, int(np.flatnonzero(p)[-1]))
