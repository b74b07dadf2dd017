"""Fixtures: tiny random GGUF / HF models (fast) and the real SmolLM2 model + HF reference
(loaded once per session)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from pagedattn.model.loader import LoadedModel, load_model
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

if TYPE_CHECKING:
    from pagedattn.model.llama import LlamaModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    return write_tiny_gguf(
        tmp_path_factory.mktemp("tiny") / "tiny.gguf", config, random_weights(config)
    )


@pytest.fixture(scope="session")
def tiny_loaded(tiny_gguf: Path) -> LoadedModel:
    return load_model(tiny_gguf)


@pytest.fixture(scope="session")
def tiny_model(tiny_loaded: LoadedModel) -> LlamaModel:
    from pagedattn.model.llama import LlamaModel

    return LlamaModel(tiny_loaded.config, tiny_loaded.weights)


@pytest.fixture(scope="session")
def real_loaded() -> LoadedModel:
    return load_model(None)


@pytest.fixture(scope="session")
def real_model(real_loaded: LoadedModel) -> LlamaModel:
    from pagedattn.model.llama import LlamaModel

    return LlamaModel.from_loaded(real_loaded)


@pytest.fixture(scope="session")
def hf_reference(real_loaded: LoadedModel) -> Iterator[tuple[Any, Any]]:
    """(model, tokenizer) from transformers, dequantized from the same GGUF to float32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = real_loaded.source
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    yield model, tokenizer


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF greedy decoding with its KV cache, ignoring EOS (so we compare a fixed length)."""
    import torch

    out: list[int] = []
    with torch.no_grad():
        result = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(max_new_tokens):
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            # transformers 5.x calls the KV cache `cache`; 4.x called it `past_key_values`
            if getattr(result, "cache", None) is not None:
                past = {"cache": result.cache}
            else:
                past = {"past_key_values": result.past_key_values}
            result = model(torch.tensor([[token]]), use_cache=True, **past)
    return out


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    """(len(ids), vocab) float32 logits of one HF forward."""
    import torch

    with torch.no_grad():
        return np.asarray(model(torch.tensor([ids])).logits[0].numpy(), dtype=np.float32)


@pytest.fixture(scope="session")
def spm_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny byte-fallback SentencePiece BPE model trained on a novel (see tests/model/spm.py)."""
    from tests.model.spm import train_spm

    return train_spm(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="session")
def spm_gguf(spm_model_file: Path) -> Path:
    """A tiny random Llama GGUF with that vocabulary (tokenizer.ggml.model "llama", add BOS)."""
    from tests.model.spm import write_spm_gguf

    return write_spm_gguf(spm_model_file.parent / "spm.gguf", spm_model_file)
