"""Logprobs of sampled and prompt tokens: the log-softmax of the model's raw logits.

As vLLM's default (``logprobs_mode="raw_logprobs"``), values come from the logits the model
returned (padded ids past the tokenizer's vocabulary masked to -inf and never listed), before
penalties, logit_bias, temperature or top-k/top-p: they describe the model, not the sampler.
Computed in float64 with max subtraction. The rank of a token is 1 + the number of tokens with a
strictly larger logprob (vLLM's definition; 1 = the most likely).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pagedattn.engine.outputs import Logprob, PositionLogprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """One position's logprobs (before detokenization).

    Attributes:
        token_id: the token at this position (sampled, or the prompt's).
        logprob: its natural-log probability.
        rank: its 1-based rank.
        top_ids: the ``N`` most likely ids, most likely first (ties by lower id).
        top_logprobs: their logprobs, same order.
    """

    token_id: int
    logprob: float
    rank: int
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()

    @property
    def top_ranks(self) -> tuple[int, ...]:
        """1-based ranks of ``top_ids`` (equal logprobs share the better rank)."""
        out: list[int] = []
        for i, lp in enumerate(self.top_logprobs):
            out.append(out[-1] if i and lp == self.top_logprobs[i - 1] else i + 1)
        return tuple(out)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64.

    Args:
        logits: (..., vocab) float logits; -inf entries (masked ids) stay -inf.

    Returns:
        float64 array of the same shape.
    """
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    shifted = x - m
    lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    out: np.ndarray = shifted - lse
    return out


def token_logprobs(logprobs_row: np.ndarray, token_id: int, num_top: int) -> TokenLogprobs:
    """The logprob, rank and top-``num_top`` alternatives of one token.

    Args:
        logprobs_row: (vocab,) float64 log-softmax of one logits row.
        token_id: the token whose logprob is reported.
        num_top: alternatives listed (0 = none).

    Raises:
        ValueError: ``token_id`` outside the row.
    """
    vocab = logprobs_row.shape[0]
    if not 0 <= token_id < vocab:
        raise ValueError(f"token_id: expected an id in [0, {vocab}), got {token_id}")
    lp = float(logprobs_row[token_id])
    rank = int(np.count_nonzero(logprobs_row > lp)) + 1
    top_ids: tuple[int, ...] = ()
    top_lps: tuple[float, ...] = ()
    if num_top > 0:
        k = min(num_top, vocab)
        part = np.argpartition(-logprobs_row, k - 1)[:k]
        order = np.lexsort((part, -logprobs_row[part]))  # by logprob desc, then id asc
        idx = part[order]
        idx = idx[np.isfinite(logprobs_row[idx])]  # a masked id is never listed
        top_ids = tuple(int(i) for i in idx)
        top_lps = tuple(float(logprobs_row[i]) for i in idx)
    return TokenLogprobs(token_id, lp, rank, top_ids, top_lps)


def to_position_logprobs(
    tl: TokenLogprobs, decode: Callable[[int], str] | None
) -> PositionLogprobs:
    """vLLM's per-position dict: the token itself first, then its top alternatives (each once),
    with ranks and decoded text (``decode(id)``; None without a tokenizer)."""
    out: PositionLogprobs = {
        tl.token_id: Logprob(tl.logprob, tl.rank, None if decode is None else decode(tl.token_id))
    }
    for token_id, lp, rank in zip(tl.top_ids, tl.top_logprobs, tl.top_ranks, strict=True):
        if token_id not in out:
            out[token_id] = Logprob(lp, rank, None if decode is None else decode(token_id))
    return out
