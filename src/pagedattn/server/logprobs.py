"""Engine logprobs -> OpenAI's two response shapes.

Completions (``logprobs: N``): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
(token text -> logprob of the token itself, then of the alternatives ranked 1..N, as OpenAI's
legacy API and vLLM: ``logprobs: 0`` still lists the token; None for the first prompt token
under ``echo``) and ``text_offset`` (each token's character offset in the choice text, counted from
``initial_offset``, as vLLM does). Chat (``logprobs: true``, ``top_logprobs: N``): one
``{token, logprob, bytes, top_logprobs: [...]}`` per generated token, the alternatives ranked
1..N. With ``as_ids`` (vLLM's ``return_tokens_as_token_ids``) every token is spelled
``token_id:<id>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import PositionLogprobs

# A logprob of -inf (a token the request banned) is not valid JSON: OpenAI clients get this.
_FLOOR = -9999.0


def _finite(x: float) -> float:
    return x if x > _FLOOR else _FLOOR


def _text(
    pos: PositionLogprobs | None, token_id: int, decode: Callable[[int], str], as_ids: bool
) -> str:
    if as_ids:
        return f"token_id:{token_id}"
    if pos is not None and token_id in pos and pos[token_id].decoded_token is not None:
        return str(pos[token_id].decoded_token)
    return decode(token_id)


def _top(pos: PositionLogprobs, num_top: int, as_ids: bool) -> list[tuple[int, str, float]]:
    """The ranked 1..num_top alternatives as (id, text, logprob), most likely first."""
    ranked = sorted((lp.rank or 0, tid) for tid, lp in pos.items() if (lp.rank or 0) <= num_top)
    return [
        (tid, f"token_id:{tid}" if as_ids else pos[tid].decoded_token or "", pos[tid].logprob)
        for _, tid in ranked
    ]


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    num_top: int,
    decode: Callable[[int], str],
    initial_offset: int = 0,
    as_ids: bool = False,
) -> p.CompletionLogprobs:
    """Completions-shaped logprobs of ``token_ids`` (one ``positions`` entry per token).

    Raises:
        ValueError: ``token_ids`` and ``positions`` of different lengths.
    """
    if len(token_ids) != len(positions):
        raise ValueError(f"positions: expected {len(token_ids)} entries, got {len(positions)}")
    out = p.CompletionLogprobs()
    offset = initial_offset
    for token_id, pos in zip(token_ids, positions, strict=True):
        text = _text(pos, token_id, decode, as_ids)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if pos is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        own = _finite(pos[token_id].logprob)
        out.token_logprobs.append(own)
        top = {text: own}  # the token itself first, then the ranked alternatives
        top.update({t: _finite(lp) for _, t, lp in _top(pos, num_top, as_ids)})
        out.top_logprobs.append(top)
    return out


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    num_top: int,
    decode: Callable[[int], str],
    as_ids: bool = False,
) -> p.ChatLogprobs:
    """Chat-shaped logprobs of generated ``token_ids``.

    Raises:
        ValueError: ``token_ids`` and ``positions`` of different lengths.
    """
    if len(token_ids) != len(positions):
        raise ValueError(f"positions: expected {len(token_ids)} entries, got {len(positions)}")
    content = []
    for token_id, pos in zip(token_ids, positions, strict=True):
        text = _text(pos, token_id, decode, as_ids)
        top = [
            p.TopLogprob(token=t, logprob=_finite(lp), bytes=list(t.encode("utf-8")))
            for _, t, lp in _top(pos, num_top, as_ids)
        ]
        content.append(
            p.ChatTokenLogprob(
                token=text,
                logprob=_finite(pos[token_id].logprob),
                bytes=list(text.encode("utf-8")),
                top_logprobs=top,
            )
        )
    return p.ChatLogprobs(content=content)
