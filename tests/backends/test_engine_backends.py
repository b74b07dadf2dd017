"""The whole engine on every available backend with the tiny random model: logits within 1e-4
of the NumPy backend (the tolerance table in DESIGN.md) and equal greedy tokens, through
chunked prefill mixed with decode, prefix caching, preemption by recompute, n > 1 child
requests sharing the prompt's pages and sliding window + sinks in both position modes."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import BackendSpec
from pagedattn.sampling_params import SamplingParams
from tests.backends.helpers import Recorder, engine_on, run, tiny_on
from tests.engine.helpers import assert_all_pages_free, drain, tokens

NUMPY = BackendSpec("numpy", "cpu")
RNG = np.random.default_rng(11)
VOCAB = tiny_on(NUMPY).config.vocab_size
PROMPTS = [RNG.integers(3, VOCAB, n).tolist() for n in (5, 13, 30, 9, 21)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _requests(params: SamplingParams = GREEDY) -> list[tuple[str, list[int], SamplingParams]]:
    return [(f"r{i}", p, params) for i, p in enumerate(PROMPTS)]


def _logits_and_tokens(spec: BackendSpec, **kwargs: object) -> tuple[list[np.ndarray], dict]:  # type: ignore[type-arg]
    model = Recorder(tiny_on(spec))
    toks, engine = run(spec, model, _requests(), **kwargs)
    assert_all_pages_free(engine)
    return model.logits, toks


@pytest.mark.parametrize(
    "options",
    [
        {"page_size": 4, "num_pages": 128, "max_num_batched_tokens": 16},
        {"page_size": 16, "num_pages": 32, "enable_prefix_caching": False},
        {"page_size": 4, "num_pages": 128, "sliding_window": 8, "num_sink_tokens": 2},
        {
            "page_size": 4, "num_pages": 128, "sliding_window": 6, "num_sink_tokens": 3,
            "position_mode": "shifted", "max_num_batched_tokens": 16,
        },
    ],
    ids=["chunked-mixed", "one-step-prefill", "window-sinks", "window-sinks-shifted"],
)  # fmt: skip
def test_logits_within_1e4_of_numpy_and_greedy_tokens_equal(
    backend: BackendSpec, options: dict[str, object]
) -> None:
    ref_logits, ref_tokens = _logits_and_tokens(NUMPY, **options)
    logits, toks = _logits_and_tokens(backend, **options)
    assert toks == ref_tokens
    assert len(logits) == len(ref_logits)
    for step, (got, want) in enumerate(zip(logits, ref_logits, strict=True)):
        assert got.dtype == np.float32 and got.shape == want.shape, step
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"step {step}")


def test_prefix_caching_reuses_pages_and_changes_nothing(backend: BackendSpec) -> None:
    model = tiny_on(backend)
    shared = PROMPTS[2]  # 30 tokens: 7 full pages of 4
    engine = engine_on(backend, model, page_size=4, num_pages=128)
    first = drain(engine, {0: [("a", [*shared, 5], GREEDY)]})["a"]
    second = drain(engine, {0: [("b", [*shared, 7], GREEDY)]})["b"]
    assert second[-1].num_cached_tokens == 28
    cold, _ = run(backend, model, [("b", [*shared, 7], GREEDY)], enable_prefix_caching=False)
    assert tokens(second) == cold["b"]
    ref, _ = run(NUMPY, tiny_on(NUMPY), [("a", [*shared, 5], GREEDY)])
    assert tokens(first) == ref["a"]


def test_preemption_recomputes_to_the_same_tokens(backend: BackendSpec) -> None:
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=14, ignore_eos=True)
    requests = [(f"r{i}", p, GREEDY if i % 2 else seeded) for i, p in enumerate(PROMPTS[:4])]
    toks, engine = run(backend, tiny_on(backend), requests, page_size=4, num_pages=14)
    assert engine.get_stats()["num_preemptions"] > 0
    roomy, _ = run(NUMPY, tiny_on(NUMPY), requests, page_size=4, num_pages=256)
    assert toks == roomy
    assert_all_pages_free(engine)


def test_n_children_hit_the_prompt_pages_and_equal_solo_seeded_runs(backend: BackendSpec) -> None:
    prompt = PROMPTS[1]  # 13 tokens: children 1, 2 hit 3 full pages, compute the 4th
    params = SamplingParams(n=3, temperature=0.9, seed=21, max_tokens=10, ignore_eos=True)
    engine = engine_on(backend, tiny_on(backend), page_size=4, num_pages=128)
    engine.add_request(prompt, params, request_id="f")
    out = list(engine.step()) + list(engine.step())
    cached = {rid: n for rid, _, n in engine.kv_snapshot()["sequences"]}
    assert cached == {"0_f": 0, "1_f": 12, "2_f": 12}
    out += drain(engine)["f"]
    by_index: dict[int, list[int]] = {}
    for o in out:
        for c in o.outputs:
            by_index.setdefault(c.index, []).extend(c.token_ids)
    numpy_model = tiny_on(NUMPY)
    for i in range(3):
        one = SamplingParams(temperature=0.9, seed=21 + i, max_tokens=10, ignore_eos=True)
        solo, _ = run(NUMPY, numpy_model, [("s", prompt, one)], page_size=4, num_pages=64)
        assert by_index[i] == solo["s"], f"completion {i}"
    assert_all_pages_free(engine)


def test_long_stream_past_the_window_evicts_and_keeps_matching(backend: BackendSpec) -> None:
    options = {
        "page_size": 4, "num_pages": 16, "sliding_window": 8, "num_sink_tokens": 4,
        "position_mode": "shifted",
    }  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    toks, engine = run(backend, tiny_on(backend), [("w", PROMPTS[0], params)], **options)
    assert engine.get_stats()["evictions"]["sliding_window"] > 0
    ref, _ = run(NUMPY, tiny_on(NUMPY), [("w", PROMPTS[0], params)], **options)
    assert toks == ref and len(toks["w"]) == 60


def test_engine_refuses_a_model_of_another_backend(torch_backend: BackendSpec) -> None:
    with pytest.raises(ValueError, match="the model runs on numpy/cpu, the engine config asks"):
        engine_on(torch_backend, tiny_on(NUMPY), num_pages=8)
