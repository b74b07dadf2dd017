"""Per-request logits processing before sampling: min_tokens, logit_bias and the repetition,
frequency and presence penalties, with vLLM's meanings (``vllm/v1/sample``), in vLLM v1's order.

Definitions (one logits row ``z`` of the next token; ``prompt`` / ``output`` are the request's
prompt and generated token ids; ``c[j]`` counts token ``j`` in ``output``):

- allowed_token_ids: every other ``z[j] = -inf``.
- bad_words_token_ids: for each sequence ``w``, ``z[w[-1]] = -inf`` when ``output`` ends with
  ``w[:-1]`` (vLLM's ``bad_words``).
- min_tokens: while ``len(output) < min_tokens``, ``z[j] = -inf`` for every end-of-sequence id
  and ``stop_token_ids`` entry (HF's ``MinNewTokensLengthLogitsProcessor``).
- logit_bias: ``z[j] += bias[j]``; a bias of -100 sets ``z[j] = -inf`` (a ban, as OpenAI says).
- repetition_penalty ``r`` (Keskar et al. 2019, arXiv 1909.05858): for every ``j`` in
  ``prompt`` or ``output``, ``z[j] = z[j] / r`` if ``z[j] > 0`` else ``z[j] * r``.
- frequency / presence (OpenAI's API reference):
  ``z[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from pagedattn.sampling_params import SamplingParams

BAN_BIAS = -100.0


def apply_logits_processing(
    row: np.ndarray,
    params: SamplingParams,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    eos_token_ids: Collection[int] = (),
) -> np.ndarray:
    """Apply ``params``' logits processors, min_tokens, logit_bias and penalties to one row.

    Args:
        row: (vocab,) float logits (not modified).
        params: the request's sampling parameters.
        prompt_token_ids: the prompt (the repetition penalty sees it).
        output_token_ids: tokens generated so far.
        eos_token_ids: end-of-sequence ids masked while ``min_tokens`` are not reached (unless
            ``ignore_eos``).

    Returns:
        (vocab,) float32 processed logits (a new array).
    """
    z = np.array(row, dtype=np.float32)
    vocab = z.shape[0]
    for proc in params.logits_processors:
        z = np.asarray(proc(output_token_ids, z), dtype=np.float32)
    if params.allowed_token_ids is not None:
        keep = np.asarray(params.allowed_token_ids, np.int64)
        kept = z[keep]
        z[:] = -np.inf
        z[keep] = kept
    for seq in params.bad_words_token_ids:
        head = len(seq) - 1
        if head <= len(output_token_ids) and (
            head == 0 or list(output_token_ids[len(output_token_ids) - head :]) == list(seq[:head])
        ):
            z[seq[-1]] = -np.inf
    if len(output_token_ids) < params.min_tokens:
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= set(eos_token_ids)
        ids = [t for t in stops if t < vocab]
        z[ids] = -np.inf
    if params.logit_bias:
        for token_id, bias in params.logit_bias.items():
            z[token_id] = -np.inf if bias <= BAN_BIAS else z[token_id] + np.float32(bias)
    if params.repetition_penalty != 1.0:
        seen = np.unique(
            np.concatenate(
                [np.asarray(prompt_token_ids, np.int64), np.asarray(output_token_ids, np.int64)]
            )
        )
        vals = z[seen]
        r = np.float32(params.repetition_penalty)
        z[seen] = np.where(vals > 0, vals / r, vals * r)
    if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        counts = np.bincount(np.asarray(output_token_ids, np.int64), minlength=vocab)[:vocab]
        z -= (
            counts * np.float32(params.frequency_penalty)
            + (counts > 0) * np.float32(params.presence_penalty)
        ).astype(np.float32)
    return z


def needs_processing(params: SamplingParams) -> bool:
    """True when :func:`apply_logits_processing` would change a row for ``params``."""
    return bool(
        params.logits_processors
        or params.min_tokens
        or params.logit_bias
        or params.has_penalties
        or params.allowed_token_ids is not None
        or params.bad_words_token_ids
    )
