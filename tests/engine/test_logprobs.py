"""Logprobs and prompt logprobs on the tiny model against a dense forward + torch log-softmax,
with chunked prefill, prefix caching and ``max_tokens=0``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tests.engine.helpers import dense_forward, drain, make_engine, model_with_weights

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.outputs import PositionLogprobs, RequestOutput
from pagedattn.sampling_params import SamplingParams

torch = pytest.importorskip("torch")

PROMPT = [1, 17, 33, 5, 60, 12, 9, 41, 23, 7, 50, 3, 28]


def _final(outs: list[RequestOutput]) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in outs:
        merge_delta(acc, o)
    return next(iter(acc.values()))


def _oracle(weights: dict[str, Any], model: Any, ids: list[int]) -> np.ndarray:
    """(len(ids), vocab) float64 log-softmax of every position's dense logits (torch)."""
    logits = dense_forward(model.config, weights, ids)
    return torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()


def _check_position(pos: PositionLogprobs, ref_row: np.ndarray, token: int, n: int) -> None:
    assert next(iter(pos)) == token  # the token itself comes first
    assert pos[token].logprob == pytest.approx(ref_row[token], abs=1e-4)
    assert pos[token].rank == int((ref_row > ref_row[token]).sum()) + 1
    top = torch.topk(torch.tensor(ref_row), n).indices.tolist()
    assert set(pos) == {token, *top}
    for i, t in enumerate(top):
        assert pos[t].logprob == pytest.approx(ref_row[t], abs=1e-4) and pos[t].rank == i + 1


@pytest.mark.parametrize("budget", [64, 5])  # one prefill step, or 5-token chunks
def test_sample_and_prompt_logprobs_equal_dense_log_softmax(budget: int) -> None:
    model, weights = model_with_weights()
    engine = make_engine(model, page_size=4, num_pages=64, max_num_batched_tokens=budget)
    params = SamplingParams(
        temperature=0.8, seed=3, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    out = _final(drain(engine, {0: [("r", PROMPT, params)]})["r"])
    c = out.outputs[0]
    ref = _oracle(weights, model, PROMPT + c.token_ids)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        pos = out.prompt_logprobs[i]
        assert pos is not None
        _check_position(pos, ref[i - 1], PROMPT[i], 2)
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids) == 6
    total = 0.0
    for j, (pos, token) in enumerate(zip(c.logprobs, c.token_ids, strict=True)):
        _check_position(pos, ref[len(PROMPT) - 1 + j], token, 3)
        total += ref[len(PROMPT) - 1 + j, token]
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-3)


def test_no_logprobs_unless_asked() -> None:
    model, _ = model_with_weights()
    engine = make_engine(model, page_size=4, num_pages=64)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    out = _final(drain(engine, {0: [("r", PROMPT, params)]})["r"])
    assert out.prompt_logprobs is None and out.outputs[0].logprobs is None
    assert out.outputs[0].cumulative_logprob is None


def test_prompt_logprobs_recompute_a_prefix_cached_prompt() -> None:
    model, weights = model_with_weights()
    engine = make_engine(model, page_size=4, num_pages=64)
    plain = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    first = _final(drain(engine, {0: [("a", PROMPT, plain)]})["a"])
    assert first.num_cached_tokens == 0
    again = _final(drain(engine, {0: [("b", PROMPT, plain)]})["b"])
    assert again.num_cached_tokens == 12  # the cache holds the prompt's full pages
    asked = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    out = _final(drain(engine, {0: [("c", PROMPT, asked)]})["c"])
    assert out.num_cached_tokens == 0  # a cached page has no logits: computed again
    ref = _oracle(weights, model, PROMPT)
    assert out.prompt_logprobs is not None
    for i in range(1, len(PROMPT)):
        pos = out.prompt_logprobs[i]
        assert pos is not None and list(pos) == [PROMPT[i]]
        assert pos[PROMPT[i]].logprob == pytest.approx(ref[i - 1, PROMPT[i]], abs=1e-4)


def test_max_tokens_zero_with_prompt_logprobs_computes_only_the_prompt() -> None:
    model, weights = model_with_weights()
    engine = make_engine(model, page_size=4, num_pages=64, max_num_batched_tokens=6)
    params = SamplingParams(max_tokens=0, prompt_logprobs=1)
    outs = drain(engine, {0: [("r", PROMPT, params)]})["r"]
    out = _final(outs)
    assert out.finished and out.outputs[0].token_ids == []
    assert out.outputs[0].finish_reason == "length"
    ref = _oracle(weights, model, PROMPT)
    assert out.prompt_logprobs is not None
    got = [p[PROMPT[i]].logprob for i, p in enumerate(out.prompt_logprobs) if p is not None]
    np.testing.assert_allclose(got, [ref[i - 1, PROMPT[i]] for i in range(1, 13)], atol=1e-4)
    assert engine.cache_manager.allocator.num_free_pages == engine.cache_manager.num_pages
    # Without prompt logprobs max_tokens=0 finishes at once, before any model work.
    engine.add_request(PROMPT, SamplingParams(max_tokens=0), request_id="z")
    (z,) = engine.step()
    assert z.finished and z.outputs[0].finish_reason == "length" and z.prompt_logprobs is None


def test_padded_ids_past_the_tokenizer_vocab_are_never_listed_nor_sampled() -> None:
    model, weights = model_with_weights()

    class SmallVocab:  # a tokenizer whose vocabulary is 8 ids shorter than the model's rows
        vocab_size = model.config.vocab_size - 8
        stop_token_ids = (2,)

        def encode(self, text: str) -> list[int]:
            raise NotImplementedError

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "".join(f"<{i}>" for i in ids)

    engine = make_engine(model, SmallVocab())
    # Make the padded ids the most likely ones: bias is refused there, so patch the logits.
    real_forward = model.forward

    def forward(batch: Any, kv: Any) -> np.ndarray:
        out = real_forward(batch, kv)
        out[:, -8:] = 1e4
        return out

    engine.runner.model = type(
        "M", (), {"forward": staticmethod(forward), "config": model.config}
    )()
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=5, ignore_eos=True, logprobs=5)
    out = _final(drain(engine, {0: [("r", PROMPT, params)]})["r"])
    c = out.outputs[0]
    assert max(c.token_ids) < SmallVocab.vocab_size
    assert c.logprobs is not None
    assert all(t < SmallVocab.vocab_size for pos in c.logprobs for t in pos)
    assert c.logprobs[0][c.token_ids[0]].decoded_token == f"<{c.token_ids[0]}>"
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request(PROMPT, SamplingParams(logit_bias={SmallVocab.vocab_size: 1.0}))
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.add_request(PROMPT, SamplingParams(stop_token_ids=[SmallVocab.vocab_size]))
    del weights
