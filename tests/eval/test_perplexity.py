"""The perplexity lab on the tiny random Llama: fast (chunked) path == token-by-token path,
budget respected, reproducible, and every policy's NLL equal to a dense HF transformers forward
whose attention mask is exactly the keys the policy left visible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.eval.perplexity import PerplexityResult, run_perplexity
from pagedattn.eval.policies import make_policy
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.model.tiny import random_hf_llama

PAGE, BUDGET = 8, 32
CASES = [
    ("full", "absolute"),
    ("window", "absolute"),
    ("sinks", "absolute"),
    ("sinks", "shifted"),
    ("random", "absolute"),
    ("h2o", "absolute"),
]


def text_ids(vocab: int, n: int = 90, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, vocab, size=n)


def run(model: LlamaModel, ids: np.ndarray, name: str, mode: str, **kw: Any) -> PerplexityResult:
    policy = make_policy(name, page_size=PAGE, budget=BUDGET, position_mode=mode, seed=5)
    return run_perplexity(model, ids, policy, page_size=PAGE, budget=BUDGET, **kw)


@pytest.mark.parametrize(("name", "mode"), [c for c in CASES if c[0] != "h2o"])
def test_fast_path_equals_token_by_token(tiny_eval_model: LlamaModel, name: str, mode: str) -> None:
    ids = text_ids(tiny_eval_model.config.vocab_size)
    fast = run(tiny_eval_model, ids, name, mode, fast=True, trace=True)
    slow = run(tiny_eval_model, ids, name, mode, fast=False, trace=True)
    assert (fast.path, slow.path) == ("fast", "token")
    assert fast.nll.shape == slow.nll.shape == (ids.size - 1,)
    np.testing.assert_allclose(fast.nll, slow.nll, rtol=0, atol=1e-4)
    assert fast.peak_pages == slow.peak_pages
    # The same pages are resident at every position on both paths (a chunk opens its later
    # pages ahead of time: those hold no key the position may see yet).
    assert fast.resident_log is not None and slow.resident_log is not None
    per_token = {start: pages for start, _, pages in slow.resident_log}
    for start, count, pages in fast.resident_log:
        for p in range(start, start + count):
            assert per_token[p] == [i for i in pages if i <= p // PAGE], p


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_budget_and_reproducibility(tiny_eval_model: LlamaModel, name: str, mode: str) -> None:
    ids = text_ids(tiny_eval_model.config.vocab_size)
    first = run(tiny_eval_model, ids, name, mode, trace=True)
    again = run(tiny_eval_model, ids, name, mode)
    np.testing.assert_array_equal(first.nll, again.nll)
    assert first.resident_log is not None
    if name == "full":
        assert first.peak_pages == -(-(ids.size - 1) // PAGE)
    else:
        assert first.peak_pages * PAGE <= BUDGET
        assert all(len(p) * PAGE <= BUDGET for _, _, p in first.resident_log)
    record = json.loads(json.dumps(first.record()))
    assert record["perplexity"] == pytest.approx(np.exp(first.nll.mean()))
    assert record["tokens"] == ids.size and record["policy"] == name


def visible_from_log(result: PerplexityResult, n: int) -> np.ndarray:
    """(n, n) keys each query may see: causal, resident at its step, and the policy's mask."""
    assert result.resident_log is not None
    mask = np.zeros((n, n), bool)
    j = np.arange(n)
    for start, count, pages in result.resident_log:
        for p in range(start, start + count):
            row = (j <= p) & np.isin(j // PAGE, pages)
            if result.sliding_window is not None:
                row &= (j > p - result.sliding_window) | (j < result.num_sink_tokens)
            mask[p] = row
    return mask


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> tuple[Any, LlamaModel]:
    """A tiny random HF Llama and our model loaded from its saved folder."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf: Any = random_hf_llama(tie_word_embeddings=True, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("tiny_hf_eval")
    hf.save_pretrained(folder, safe_serialization=True)
    load_model(tiny_gguf).tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    loaded = load_model(folder)
    return hf, LlamaModel(loaded.config, loaded.weights)


@pytest.mark.hf
@pytest.mark.parametrize(("name", "mode"), [c for c in CASES if c[1] == "absolute"])
def test_nll_equals_hf_with_the_policys_mask(
    hf_pair: tuple[Any, LlamaModel], name: str, mode: str
) -> None:
    import torch

    hf, model = hf_pair
    ids = text_ids(model.config.vocab_size)
    ours = run(model, ids, name, mode, fast=False, trace=True)
    n = ids.size - 1
    visible = visible_from_log(ours, n)
    if name == "window":  # by hand: the last W = (4 - 1) * 8 + 1 = 25 tokens
        i, j = np.indices((n, n))
        np.testing.assert_array_equal(visible, (j <= i) & (j > i - 25))
    mask = torch.full((1, 1, n, n), torch.finfo(torch.float32).min)
    mask[0, 0][torch.from_numpy(visible)] = 0.0
    with torch.no_grad():
        logits = hf(torch.tensor(ids[None, :n]), attention_mask=mask).logits[0].double()
    expected = torch.logsumexp(logits, -1) - logits[torch.arange(n), torch.tensor(ids[1:])]
    np.testing.assert_allclose(ours.nll, expected.numpy(), rtol=0, atol=1e-4)
