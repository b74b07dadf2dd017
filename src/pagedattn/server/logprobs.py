"""Engine logprobs -> OpenAI's two response shapes.

Completions (``logprobs: N``): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
(token text -> logprob of the alternatives ranked 1..N; None for the first prompt token under
``echo``) and ``text_offset`` (each token's character offset in the choice text, counted from
``initial_offset``, as vLLM does). Chat (``logprobs: true``, ``top_logprobs: N``): one
``{token, logprob, bytes, top_logprobs: [...]}`` per generated token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import PositionLogprobs

# A logprob of -inf (a token the request banned) is not valid JSON: OpenAI clients get this.
_FLOOR = -9999.0


def _finite(x: float) -> float:
    return x if x > _FLOOR else _FLOOR


def _text(pos: PositionLogprobs | None, token_id: int, decode: Callable[[int], str]) -> str:
    if pos is not None and token_id in pos and pos[token_id].decoded_token is not None:
        return str(pos[token_id].decoded_token)
    return decode(token_id)


def _top(pos: PositionLogprobs, num_top: int) -> list[tuple[int, str, float]]:
    """The ranked 1..num_top alternatives as (id, text, logprob), most likely first."""
    ranked = sorted((lp.rank or 0, tid) for tid, lp in pos.items() if (lp.rank or 0) <= num_top)
    return [(tid, pos[tid].decoded_token or "", pos[tid].logprob) for _, tid in ranked]


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    num_top: int,
    decode: Callable[[int], str],
    initial_offset: int = 0,
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
        text = _text(pos, token_id, decode)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if pos is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_finite(pos[token_id].logprob))
        out.top_logprobs.append({t: _finite(lp) for _, t, lp in _top(pos, num_top)})
    return out


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    num_top: int,
    decode: Callable[[int], str],
) -> p.ChatLogprobs:
    """Chat-shaped logprobs of generated ``token_ids``.

    Raises:
        ValueError: ``token_ids`` and ``positions`` of different lengths.
    """
    if len(token_ids) != len(positions):
        raise ValueError(f"positions: expected {len(token_ids)} entries, got {len(positions)}")
    content = []
    for token_id, pos in zip(token_ids, positions, strict=True):
        text = _text(pos, token_id, decode)
        top = [
            p.TopLogprob(token=t, logprob=_finite(lp), bytes=list(t.encode("utf-8")))
            for _, t, lp in _top(pos, num_top)
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
