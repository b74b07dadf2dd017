"""The checks and helpers of vLLM's extra request fields
(:mod:`pagedattn.server.vllm_request` declares them): which values change nothing, int64
seeds, prompt truncation, ``bad_words`` as token sequences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagedattn.server.errors import APIError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


# field -> (accepts the value?, what is accepted): the fields that would change the output
# (or promise something) with any other value
NO_EFFECT: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "use_beam_search": (lambda v, r: v is False, "false (beam search is not served)"),
    "length_penalty": (lambda v, r: True, "any value (it only weighs beam search)"),
    "spaces_between_special_tokens": (
        lambda v, r: v is True or r.skip_special_tokens,
        "true, or any value while skip_special_tokens is true (no special token is written)",
    ),
    "priority": (lambda v, r: v == 0, "0 (requests are served first come, first served)"),
    "prompt_embeds": (lambda v, r: _empty(v), "null (prompts are text or token ids)"),
    "cache_salt": (lambda v, r: v is None, "null (the prefix cache is not salted)"),
    "kv_transfer_params": (lambda v, r: _empty(v), "null (no disaggregated prefill)"),
    "vllm_xargs": (lambda v, r: _empty(v), "null (no custom extensions)"),
    "repetition_detection": (lambda v, r: _empty(v), "null"),
    "reasoning_effort": (lambda v, r: v is None, "null (no reasoning parser)"),
    "thinking_token_budget": (lambda v, r: v is None or v == -1, "null or -1 (unlimited)"),
    "include_reasoning": (lambda v, r: True, "any value (no reasoning parser: nothing to split)"),
    "media_io_kwargs": (lambda v, r: _empty(v), "null (the model takes text only)"),
    "mm_processor_kwargs": (lambda v, r: _empty(v), "null (the model takes text only)"),
}


def check_vllm_fields(req: Any) -> None:
    """Raises APIError 400 naming the first vLLM field whose value this server cannot honour
    (see :data:`NO_EFFECT`), or an out-of-range seed / truncation / allowed id."""
    for name, (accepts, what) in NO_EFFECT.items():
        if name in type(req).model_fields and not accepts(getattr(req, name), req):
            raise APIError(
                400,
                f"{name}: only {what} is accepted here, got {getattr(req, name)!r}",
                param=name,
            )
    if req.seed is not None and not INT64_MIN <= req.seed <= INT64_MAX:
        raise APIError(400, f"seed: expected an int64, got {req.seed}", param="seed")
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens < -1:
        raise APIError(
            400,
            f"truncate_prompt_tokens: expected -1 or an int >= 0, got {req.truncate_prompt_tokens}",
            param="truncate_prompt_tokens",
        )
    if req.allowed_token_ids is not None and not req.allowed_token_ids:
        raise APIError(
            400, "allowed_token_ids: expected at least one token id", param="allowed_token_ids"
        )


def engine_seed(seed: int | None) -> int | None:
    """An int64 seed as the engine's non-negative one (two's complement: -1 is 2**64 - 1)."""
    return None if seed is None else seed % 2**64


def truncated(
    ids: list[int], keep: int | None, side: str | None, max_input: int | None
) -> list[int]:
    """The prompt ids under ``truncate_prompt_tokens`` = ``keep`` (vLLM's rules: -1 = the
    ``max_input`` the context leaves; more than ``max_input`` is a 400; ``left`` keeps the
    last ids, ``right`` the first)."""
    if keep is None:
        return ids
    if keep == -1:
        if max_input is None:
            return ids
        keep = max_input
    if max_input is not None and keep > max_input:
        raise APIError(
            400,
            f"truncate_prompt_tokens: {keep} is more than the {max_input} prompt tokens the "
            "context leaves beside max_tokens; request a smaller truncation size",
            param="truncate_prompt_tokens",
        )
    if keep >= len(ids):
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep :]


def bad_word_ids(words: list[str], tokenizer: Any) -> list[list[int]]:
    """The token sequences ``bad_words`` bans (vLLM's rule): each word's tokens, and those of
    the word after a space when that spelling starts with another token of the same count."""
    out: list[list[int]] = []
    for word in words:
        for spaced in (False, True):
            ids = [int(t) for t in tokenizer.encode(" " * spaced + word.lstrip(), False)]
            if not ids:
                raise APIError(400, f"bad_words: {word!r} has no tokens", param="bad_words")
            if not spaced or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    return out
