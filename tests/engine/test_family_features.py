"""The engine's features on the Qwen 2 and Gemma 3 families, driven as a user drives them, on
tiny random models written as llama.cpp writes those families (tests/model/families.py: Qwen's
q/k/v biases and grouped-query attention; Gemma's sliding-window layers, GELU, extra norms,
tied embeddings), each against an oracle outside the code under test:

* prefix caching: a second prompt sharing a first's prefix answers as with caching off and as
  HF transformers, and reports as cached exactly the shared full pages (counted by hand);
* ``n`` > 1 and ``best_of``: child ``i`` equals a solo request with seed ``seed + i``; best_of
  returns the solo runs with the highest cumulative logprobs;
* n-gram speculation: greedy tokens equal the plain engine's and transformers' greedy tokens,
  with drafts verified and accepted;
* int8 KV pages: logits within a stated tolerance of transformers' on a prompt past the sliding
  window, fed as chunks and then decoded one row at a time; int8 activations: the same, against
  the exact path on the same Q8_0 file.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tests.engine.helpers import drain, make_engine, solo, tokens
from tests.model.conftest import hf_greedy, hf_logits
from tests.model.families import WINDOW, gguf_with_oracle
from tests.model.paging import PagedSequences

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.outputs import RequestOutput
from pagedattn.kernels.target import has_avx2
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

pytestmark = pytest.mark.hf
PS = 4  # page size: prompts span many pages and several windows


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp(request.param)
    hf, path = gguf_with_oracle(request.param, root)
    loaded = load_model(path)
    model = DecoderModel.from_loaded(loaded)
    return SimpleNamespace(name=request.param, hf=hf, path=path, root=root, model=model,
                           tokenizer=loaded.tokenizer)  # fmt: skip


def _prompt(seed: int, length: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 272, length)]


def _final(outs: list[RequestOutput]) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in outs:
        merge_delta(acc, o)
    return next(iter(acc.values()))


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)


def test_prefix_caching_on_equals_off_and_counts_the_shared_pages(family: Any) -> None:
    shared = _prompt(1, 4 * WINDOW + 2)  # 34 tokens: 8 full pages, then 2 tokens of page 9
    first, second = shared + _prompt(2, 5), shared + _prompt(3, 7)
    assert first[len(shared)] != second[len(shared)]
    runs = {}
    for caching in (True, False):
        engine = make_engine(family.model, family.tokenizer, page_size=PS, num_pages=128,
                             enable_prefix_caching=caching)  # fmt: skip
        drain(engine, {0: [("first", first, GREEDY)]})
        runs[caching] = _final(drain(engine, {0: [("second", second, GREEDY)]})["second"])
    on, off = runs[True], runs[False]
    assert on.num_cached_tokens == len(shared) // PS * PS == 32  # the shared full pages
    assert off.num_cached_tokens == 0
    assert on.outputs[0].token_ids == off.outputs[0].token_ids
    assert on.outputs[0].token_ids == hf_greedy(family.hf, second, 8)
    for a, b in zip(on.outputs[0].logprobs or [], off.outputs[0].logprobs or [], strict=True):
        token = next(iter(a))
        assert abs(a[token].logprob - b[token].logprob) < 1e-4


def test_n_children_equal_solo_runs_and_best_of_ranks_them(family: Any) -> None:
    prompt = _prompt(4, 2 * WINDOW + 3)
    sampled = {"temperature": 1.0, "max_tokens": 8, "ignore_eos": True}
    engine = make_engine(family.model, family.tokenizer, page_size=PS, num_pages=128)
    out = _final(drain(engine, {0: [("n", prompt, SamplingParams(n=3, seed=11, **sampled))]})["n"])
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        alone = SamplingParams(seed=11 + i, **sampled)
        assert c.token_ids == solo(family.model, prompt, alone, page_size=PS, num_pages=128)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1

    best = SamplingParams(n=2, best_of=4, seed=21, **sampled)
    got = _final(drain(engine, {0: [("best", prompt, best)]})["best"]).outputs
    runs = []
    for i in range(4):
        e = make_engine(family.model, family.tokenizer, page_size=PS, num_pages=128)
        alone = SamplingParams(seed=21 + i, logprobs=0, **sampled)
        runs.append(_final(drain(e, {0: [("x", prompt, alone)]})["x"]).outputs[0])
    ranked = sorted(runs, key=lambda c: -(c.cumulative_logprob or 0.0))[:2]
    assert [c.token_ids for c in got] == [c.token_ids for c in ranked]


def test_ngram_speculation_equals_plain_and_transformers_greedy(family: Any) -> None:
    # one token repeated: both random models answer it with runs of a token (Qwen's: 210 seven
    # times), which n-gram drafts continue and the verify accepts
    prompt = [40] * (3 * WINDOW)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    want = hf_greedy(family.hf, prompt, 32)
    outs = {}
    for spec in ("ngram", None):
        engine = make_engine(family.model, family.tokenizer, page_size=PS, num_pages=128,
                             speculative=spec, speculative_row_cost=0.0)  # fmt: skip
        outs[spec] = tokens(drain(engine, {0: [("r", prompt, params)]})["r"])
        stats = engine.scheduler.stats
        if spec is not None:
            assert stats.spec_num_drafted_tokens > 0 and stats.spec_num_accepted_tokens > 0
        else:
            assert stats.spec_num_drafted_tokens == 0
    assert outs["ngram"] == outs[None] == want


def _chunked_then_decoded(model: DecoderModel, ids: list[int], kv_dtype: str) -> np.ndarray:
    """Logits of every row: the first half of ``ids`` as prefill chunks of 7, the rest as
    one-row decode steps (the fused layer), on a pool of ``kv_dtype``."""
    state = PagedSequences(model, num_pages=len(ids) // PS + 4, page_size=PS)
    if kv_dtype == "int8":  # rows of head_dim codes and a float32 scale
        shape = state.kv.shape
        state.kv = np.zeros((*shape[:-1], shape[-1] + 4), np.int8)
    seq = state.new_sequence()
    half = len(ids) // 2
    rows = [state.all_logits(seq, ids[i : min(i + 7, half)]) for i in range(0, half, 7)]
    rows += [state.step({seq: [t]}) for t in ids[half:]]
    return np.concatenate(rows)


def _worst(ours: np.ndarray, want: np.ndarray) -> float:
    """The largest logit error relative to the row's spread of logits."""
    spread = want.max(axis=1) - want.min(axis=1)
    return float((np.abs(ours - want).max(axis=1) / spread).max())


def _agree(ours: np.ndarray, want: np.ndarray) -> float:
    """The share of rows whose greedy token is the oracle's."""
    return float((ours.argmax(axis=1) == want.argmax(axis=1)).mean())


# measured worst logit error / the row's logit range, with margin: the tiny random Qwen (large
# random weights and biases) amplifies any rounding far more than the tiny Gemma
KV_INT8_TOLERANCE = {"qwen2": 0.1, "gemma3": 0.01}  # measured 0.056, 0.0054
ACTIVATIONS_INT8_TOLERANCE = {"qwen2": 0.25, "gemma3": 0.02}  # measured 0.15, 0.0095


def test_int8_kv_pages_stay_near_transformers(family: Any) -> None:
    """Int8 pages against transformers' logits: within :data:`KV_INT8_TOLERANCE` of each row's
    logit range, the greedy token of >= 90 % of the rows (float32 pages: 1e-4 absolute)."""
    ids = _prompt(6, 5 * WINDOW + 3)
    want = hf_logits(family.hf, ids)
    exact = _chunked_then_decoded(family.model, ids, "float32")
    np.testing.assert_allclose(exact, want, rtol=0, atol=1e-4)
    quantized = _chunked_then_decoded(family.model, ids, "int8")
    assert not np.array_equal(quantized, exact)
    assert _worst(quantized, want) < KV_INT8_TOLERANCE[family.name]
    assert _agree(quantized, want) >= 0.9


@pytest.mark.skipif(not has_avx2(), reason="int8 activations need AVX2")
def test_int8_activations_stay_near_the_exact_path(family: Any) -> None:
    """A Q8_0 file of the family (every matrix meets int8 inputs, the fused decode layer
    included) against the exact path on the same file: within
    :data:`ACTIVATIONS_INT8_TOLERANCE` of each row's logit range, the same greedy token on
    >= 90 % of the rows."""
    _, path = gguf_with_oracle(family.name, family.root, qtype=Q.Q8_0)
    loaded = load_model(path)
    model = DecoderModel.from_loaded(loaded, "int8")
    assert model._fused is not None  # decode rows take the fused layer, on the int8 path
    ids = _prompt(7, 5 * WINDOW + 3)
    exact = _chunked_then_decoded(DecoderModel.from_loaded(loaded), ids, "float32")
    int8 = _chunked_then_decoded(model, ids, "float32")
    assert not np.array_equal(int8, exact)
    assert _worst(int8, exact) < ACTIVATIONS_INT8_TOLERANCE[family.name]
    assert _agree(int8, exact) >= 0.9
