"""Sliding window + attention sinks through the engine: exact logits and bounded memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.engine.helpers import (
    RecordingModel,
    assert_all_pages_free,
    dense_forward,
    drain,
    make_engine,
    model_with_weights,
    tokens,
)

from pagedattn.sampling_params import SamplingParams

RNG = np.random.default_rng(5)


def _record(model: object, prompt: list[int], **kwargs: object) -> RecordingModel:
    recorder = RecordingModel(model)  # type: ignore[arg-type]
    engine = make_engine(recorder, **kwargs)
    drain(engine, {0: [("r", prompt, SamplingParams(temperature=0, max_tokens=1))]})
    assert_all_pages_free(engine)
    return recorder


@pytest.mark.parametrize("num_sink_tokens", [0, 2])
def test_window_prefill_equals_token_by_token_decode(num_sink_tokens: int) -> None:
    model, _ = model_with_weights(seed=1)
    prompt = RNG.integers(3, model.config.vocab_size, 12).tolist()
    kwargs = {"page_size": 4, "num_pages": 16, "sliding_window": 4}
    kwargs["num_sink_tokens"] = num_sink_tokens
    whole = _record(model, prompt, enable_chunked_prefill=False, **kwargs)
    stepwise = _record(model, prompt, max_num_batched_tokens=1, **kwargs)
    assert len(whole.batches) == 1 and not whole.batches[0].is_decode
    assert len(stepwise.batches) == 12 and all(b.is_decode for b in stepwise.batches)
    for pos in range(12):
        np.testing.assert_allclose(
            stepwise.by_position[pos], whole.by_position[pos], rtol=0, atol=1e-4
        )


@pytest.mark.parametrize(("chunk", "num_sink_tokens"), [(100, 0), (24, 0), (7, 4)])
def test_long_prompt_under_window_matches_dense_masked_forward(
    chunk: int, num_sink_tokens: int
) -> None:
    model, weights = model_with_weights(seed=2)
    prompt = RNG.integers(3, model.config.vocab_size, 100).tolist()
    recorder = _record(
        model,
        prompt,
        page_size=16,
        num_pages=16,
        sliding_window=32,
        num_sink_tokens=num_sink_tokens,
        max_num_batched_tokens=chunk,
    )
    dense = dense_forward(
        model.config, weights, prompt, sliding_window=32, num_sink_tokens=num_sink_tokens
    )
    got = np.stack([recorder.by_position[p] for p in range(100)])
    np.testing.assert_allclose(got, dense, rtol=0, atol=1e-4)
    # Sanity: the window matters (full attention differs).
    assert not np.allclose(dense, dense_forward(model.config, weights, prompt), atol=1e-3)


def test_long_stream_keeps_resident_pages_bounded() -> None:
    model, _ = model_with_weights(seed=4, max_position_embeddings=64)
    W, S, ps, chunk = 8, 4, 4, 16
    decode_bound = math.ceil(W / ps) + 1 + math.ceil(S / ps)
    chunk_bound = math.ceil((W + chunk - 2) / ps) + 1 + math.ceil(S / ps)
    engine = make_engine(
        model,
        page_size=ps,
        num_pages=chunk_bound,  # exactly the bound: more would never be needed
        sliding_window=W,
        num_sink_tokens=S,
        max_num_batched_tokens=chunk,
    )
    prompt = RNG.integers(3, model.config.vocab_size, 3000).tolist()
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=300, ignore_eos=True), "s")
    manager, generated, steps = engine.cache_manager, 0, 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.outputs[0].token_ids) for o in engine.step())
        steps += 1
        seq = engine.scheduler.get("s")
        if seq is None:
            break
        resident = sum(p != -1 for p in manager.page_table(seq.seq_id))
        referenced = manager.num_pages - manager.allocator.num_free_pages
        assert resident == referenced
        in_prefill = seq.num_generated_tokens <= 1
        assert resident <= (chunk_bound if in_prefill else decode_bound), (steps, resident)
    assert generated == 300 and engine.get_stats()["num_preemptions"] == 0
    assert engine.get_stats()["evictions"]["sliding_window"] > 700
    assert_all_pages_free(engine)


def test_shifted_mode_matches_dense_forward_over_retained_tokens() -> None:
    """One layer: each token's K/V depend on that token alone, so a dense forward over exactly
    the retained ids (S sinks + the last W tokens) at positions 0..n-1 is the oracle."""
    max_pos = 24
    model, weights = model_with_weights(seed=6, num_layers=1, max_position_embeddings=max_pos)
    W, S, ps = 8, 4, 4
    recorder = RecordingModel(model)
    engine = make_engine(
        recorder,
        page_size=ps,
        num_pages=8,
        sliding_window=W,
        num_sink_tokens=S,
        position_mode="shifted",
        max_num_batched_tokens=10,
    )
    prompt = RNG.integers(3, model.config.vocab_size, 30).tolist()
    params = SamplingParams(temperature=0, max_tokens=10 * max_pos, ignore_eos=True)
    out = tokens(drain(engine, {0: [("s", prompt, params)]})["s"])
    assert len(out) == 10 * max_pos  # far past max_position_embeddings
    stream = prompt + out
    assert max(recorder.by_position) == len(stream) - 2  # the last token is never computed
    for p, logits in recorder.by_position.items():
        retained = stream[: p + 1] if p < S + W else stream[:S] + stream[p - W + 1 : p + 1]
        expected = dense_forward(model.config, weights, retained)[-1]
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4, err_msg=f"pos {p}")
    assert_all_pages_free(engine)
