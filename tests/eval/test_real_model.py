"""The perplexity lab on the embedded SmolLM2: with ``full``, the perplexity over 1,024 tokens
of the shipped novel equals HF transformers' on the same GGUF and the same token ids."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.eval.perplexity import run_perplexity
from pagedattn.eval.policies import make_policy
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model


@pytest.mark.model
@pytest.mark.hf
def test_full_perplexity_equals_hf_on_1024_tokens() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    loaded = load_model(None)
    ids = corpus_token_ids(loaded.tokenizer, None, 1024)[:1024]
    ours = run_perplexity(
        LlamaModel.from_loaded(loaded),
        ids,
        make_policy("full", page_size=16, budget=None),
        page_size=16,
    )
    path = loaded.source
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1].double()
    nll = torch.logsumexp(logits, -1) - logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    expected = math.exp(float(nll.mean()))
    assert ours.tokens == 1024 and ours.nll.size == 1023
    assert ours.perplexity == pytest.approx(expected, rel=1e-3)
    np.testing.assert_allclose(ours.nll, nll.numpy(), rtol=0, atol=2e-2)
