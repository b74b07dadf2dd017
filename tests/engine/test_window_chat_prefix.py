"""A chat under the user's own sliding window (StreamingLLM ``--sliding-window``) on the
embedded SmolLM2: each turn reuses the last one through the prefix cache, and the replies equal
a run with prefix caching off (marked ``model``)."""

from __future__ import annotations

import itertools

import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

pytestmark = pytest.mark.model
PS = 16
USER = [
    "Tell me about the history of the bicycle, its inventors and how it changed cities.",
    "Now compare it with the history of the railway in the same century, briefly.",
    "Which of the two mattered more for ordinary workers? Answer in two sentences.",
]


def _conversation(caching: bool) -> list[tuple[int, list[int], list[int]]]:
    """Per turn: (cached prompt tokens, the turn's prompt ids, the reply ids)."""
    params = SamplingParams(temperature=0, max_tokens=120)
    out = []
    with LLM(page_size=PS, num_pages=256, sliding_window=96,
             enable_prefix_caching=caching) as llm:  # fmt: skip
        messages: list[dict[str, str]] = []
        for text in USER:
            messages.append({"role": "user", "content": text})
            prompt = llm.engine.tokenizer.encode_chat(messages)
            reply = llm.chat(messages, params, use_tqdm=False)[0]
            out.append((reply.num_cached_tokens, list(prompt), list(reply.outputs[0].token_ids)))
            messages.append({"role": "assistant", "content": reply.outputs[0].text})
    return out


def test_chat_turns_reuse_the_window_cache() -> None:
    cached, plain = _conversation(True), _conversation(False)
    assert [r for _, _, r in cached] == [r for _, _, r in plain]
    assert [c for c, _, _ in plain] == [0, 0, 0]
    assert cached[0][0] == 0
    for (_, before, reply), (hit, prompt, _) in itertools.pairwise(cached):
        # the KV the last turn wrote: its prompt and reply but the reply's last token; the hit
        # is its longest common prefix with this turn's prompt, in whole pages
        written = [*before, *reply][: len(before) + len(reply) - 1]
        common = next(
            (i for i, (a, b) in enumerate(zip(written, prompt, strict=False)) if a != b),
            min(len(written), len(prompt)),
        )
        assert hit == common // PS * PS > 96
