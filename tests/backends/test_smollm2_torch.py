"""SmolLM2-135M (embedded GGUF) on torch-CPU vs the NumPy backend: greedy tokens equal for 64
tokens on the chat prompt, logits within 1e-3 at every step (DESIGN.md tolerance table)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import BackendSpec
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.build import build_model
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from tests.backends.helpers import Recorder
from tests.engine.helpers import drain, tokens

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.model
def test_torch_cpu_greedy_64_tokens_and_logits_match_numpy() -> None:
    pytest.importorskip("torch")
    loaded = load_model(None)
    prompt = loaded.tokenizer.encode_chat(CHAT)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    runs = {}
    for spec in (BackendSpec("numpy", "cpu"), BackendSpec("torch", "cpu")):
        model = Recorder(build_model(loaded, spec))
        config = EngineConfig(
            cache=CacheConfig(page_size=16, num_pages=64), backend=spec.name, device=spec.device
        )
        engine = LLMEngine(config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint)
        out = drain(engine, {0: [("chat", prompt, params)]})["chat"]
        runs[spec.name] = (tokens(out), model.logits)
    (want, want_logits), (got, got_logits) = runs["numpy"], runs["torch"]
    assert len(want) == 64 and got == want
    assert "Paris" in loaded.tokenizer.decode(want, skip_special_tokens=True)
    assert len(got_logits) == len(want_logits) == 64
    worst = max(float(np.abs(g - w).max()) for g, w in zip(got_logits, want_logits, strict=True))
    assert worst <= 1e-3, worst
