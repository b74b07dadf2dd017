"""llama-perplexity's method on the tiny random Llama: chunks from an empty cache, BOS at every
chunk's start when the vocabulary adds one, second halves scored; checked against plain float32
prefills of the chunks built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.eval.chunks import run_chunked_perplexity
from pagedattn.model.llama import LlamaModel
from tests.model.paging import PagedSequences


def _prefill_nll(model: LlamaModel, ids: list[int]) -> np.ndarray:
    state = PagedSequences(model, num_pages=8, page_size=8)
    x = state.all_logits(state.new_sequence(), ids[:-1]).astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    out: np.ndarray = lse - x[np.arange(len(ids) - 1), ids[1:]]
    return out


def test_bos_starts_every_chunk(tiny_eval_model: LlamaModel) -> None:
    ids = np.random.default_rng(3).integers(3, tiny_eval_model.config.vocab_size, 50).tolist()
    got = run_chunked_perplexity(tiny_eval_model, ids, chunk_tokens=16, page_size=8, bos_token_id=1)
    # By hand: [BOS] + 50 ids = 51 -> 3 chunks of 16; each chunk's first id becomes BOS; the
    # logits at positions 8 .. 14 are scored against the next id: 3 x 7 tokens
    with_bos = [1, *ids]
    chunks = [[1, *with_bos[k * 16 + 1 : (k + 1) * 16]] for k in range(3)]
    expected = np.concatenate([_prefill_nll(tiny_eval_model, c)[8:15] for c in chunks])
    assert got.nll.shape == (21,) and (got.tokens, got.extra["chunks"]) == (48, 3)
    np.testing.assert_allclose(got.nll, expected, rtol=0, atol=1e-4)
    assert got.record()["method"] == "chunks"


def test_refuses_odd_chunks_and_short_text(tiny_eval_model: LlamaModel) -> None:
    with pytest.raises(ValueError, match="chunk_tokens: expected an even int >= 4"):
        run_chunked_perplexity(tiny_eval_model, list(range(3, 40)), chunk_tokens=15)
    with pytest.raises(ValueError, match="N >= chunk_tokens=64"):
        run_chunked_perplexity(tiny_eval_model, list(range(3, 40)), chunk_tokens=64)
