"""Refuse, before it is queued, a request whose constraints together admit no output.

Each constraint alone may be fine; together they can leave nothing to sample:

- ``logit_bias`` of -100 (a ban) on every id (or every id ``allowed_token_ids`` keeps), or on
  every id a structured-output constraint allows first (``guided_choice: ["yes"]`` with the
  tokens that start "yes" banned);
- ``min_tokens`` against a closed ``guided_choice`` whose every choice is shorter (in bytes,
  the most tokens a choice can take) than ``min_tokens``: the output completes before
  ``min_tokens`` and end-of-sequence is then the only token left.

The first step's allowed set is computed exactly (the padded vocabulary, the grammar's first
mask, the bans, and end-of-sequence while ``min_tokens`` are not reached); an empty set is a
400 naming the fields that emptied it. What can only be known while decoding (a grammar that
dead-ends later) ends the completion with finish reason ``length``
(:class:`pagedattn.engine.outputs.DeadEndError`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from pagedattn.engine.penalties import BAN_BIAS
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.errors import APIError


def check_satisfiable(
    params: SamplingParams,
    processors: Sequence[Any],
    num_tokens: int,
    width: int,
    eos_token_ids: Collection[int],
) -> None:
    """Raises APIError 400 when ``params`` with ``processors`` allow no first token, or a
    closed choice cannot reach ``min_tokens``.

    Args:
        params: the request's sampling parameters (``logit_bias``, ``min_tokens``...).
        processors: its guided-decoding processors (each has ``allowed(ids)`` and ``spec``).
        num_tokens: the tokenizer's vocabulary size (ids past it are never sampled).
        width: the model's logits width.
        eos_token_ids: the ids that end generation unless ``ignore_eos``.
    """
    guided = [pr for pr in processors if hasattr(pr, "allowed")]
    guided_field = next((pr.spec.field for pr in guided if pr.spec is not None), None)
    _check_min_tokens(params, guided)
    allowed = np.arange(width) < num_tokens
    if params.allowed_token_ids is not None:
        only = np.zeros(width, dtype=bool)
        only[[t for t in params.allowed_token_ids if 0 <= t < width]] = True
        allowed &= only
    grammar_allowed = allowed.copy()
    for pr in guided:
        grammar_allowed &= pr.allowed([])
    banned = np.zeros(width, dtype=bool)
    for token_id, bias in (params.logit_bias or {}).items():
        if bias <= BAN_BIAS and 0 <= token_id < width:
            banned[token_id] = True
    ends = np.zeros(width, dtype=bool)
    if params.min_tokens > 0:
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        ends[[t for t in stops if 0 <= t < width]] = True
    if (grammar_allowed & ~banned & ~ends).any():
        return
    fields = [f for f, hit in (("logit_bias", (grammar_allowed & banned).any()),) if hit]
    if params.allowed_token_ids is not None:
        fields.append("allowed_token_ids")
    if params.min_tokens > 0 and (grammar_allowed & ends).any():
        fields.append("min_tokens")
    if guided_field is not None:
        fields.append(guided_field)
    names = " + ".join(fields) or "logit_bias"
    what = "the tokens the " + guided_field + " allows" if guided_field else "the vocabulary"
    raise APIError(
        400,
        f"{names}: together these admit no output: they exclude every token of {what} "
        "at the first step",
        param=fields[0] if fields else "logit_bias",
    )


def _check_min_tokens(params: SamplingParams, guided: Sequence[Any]) -> None:
    if params.min_tokens <= 0:
        return
    for pr in guided:
        spec = pr.spec
        if spec is None or spec.kind != "choice":
            continue
        most = max(len(str(c).encode("utf-8")) for c in spec.value)
        if most < params.min_tokens:
            raise APIError(
                400,
                f"min_tokens: {params.min_tokens} tokens can never be generated under "
                f"{spec.field}: its longest choice is {most} bytes (at most {most} tokens), "
                "and only end-of-sequence may follow a complete choice",
                param="min_tokens",
            )
