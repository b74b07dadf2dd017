"""The ``prompt_logprobs`` request field, answered in vLLM's format.

``prompt_logprobs: N`` (0..20, completions and chat, not streamed, as vLLM) asks for the
log-probability of every prompt token given the tokens before it: the response carries one
entry per prompt token (on each completions choice, at the top of a chat response), ``null``
for the first token (nothing precedes it) and otherwise a map from token id (a JSON string)
to ``{"logprob", "rank", "decoded_token"}`` holding the prompt's own token (at whatever rank)
and the ``N`` most likely tokens at that position (ranks 1..N).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from typing_extensions import TypedDict

from pagedattn.engine.outputs import PositionLogprobs

# A logprob of -inf (a token the request banned) is not valid JSON: clients get this.
_FLOOR = -9999.0


class PromptLogprob(TypedDict):
    """One token's entry at one prompt position (vLLM's ``Logprob``). A plain dict, not a
    model: a long prompt has a hundred thousand of them, and dicts of plain values cost the
    garbage collector nothing to walk."""

    logprob: float
    rank: int | None
    decoded_token: str | None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


def prompt_logprobs_of(
    prompt_token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    num_top: int,
    decode: Callable[[int], str],
) -> PromptLogprobs:
    """vLLM-shaped prompt logprobs: per position the prompt's token and the ranked 1..num_top
    alternatives.

    Raises:
        ValueError: ``positions`` not one per prompt token.
    """
    if len(positions) != len(prompt_token_ids):
        raise ValueError(
            f"prompt_logprobs: expected {len(prompt_token_ids)} positions, got {len(positions)}"
        )
    out: PromptLogprobs = []
    for token_id, pos in zip(prompt_token_ids, positions, strict=True):
        if pos is None:
            out.append(None)
            continue
        entry: dict[str, PromptLogprob] = {}
        for tid, lp in pos.items():
            if tid != token_id and (lp.rank is None or lp.rank > num_top):
                continue
            text = lp.decoded_token if lp.decoded_token is not None else decode(tid)
            entry[str(tid)] = PromptLogprob(
                logprob=max(lp.logprob, _FLOOR), rank=lp.rank, decoded_token=text
            )
        out.append(entry)
    return out
