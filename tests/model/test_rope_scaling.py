"""Llama-3.1/3.2 RoPE scaling, both loaders, against HF transformers on a tiny random model.

The oracle is transformers' ``LlamaForCausalLM`` with ``rope_type: llama3`` loaded from the HF
folder; the same weights are also written as a GGUF the way llama.cpp's converter does
(``rope_freqs.weight``). Positions run to twice the original context.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.config import CacheConfig, EngineConfig, ModelConfig
from pagedattn.engine.llm import LLM
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import LoadedModel, load_model
from pagedattn.sampling_params import SamplingParams
from tests.model.conftest import hf_logits
from tests.model.paging import PagedSequences
from tests.model.tiny import tiny_config, write_tiny_gguf

ORIGINAL_CONTEXT = 64
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": ORIGINAL_CONTEXT,
}
LENGTH = 2 * ORIGINAL_CONTEXT  # positions 0 .. 2x the original context - 1


def converter_rope_freqs(head_dim: int, theta: float, scaling: dict[str, Any]) -> np.ndarray:
    """llama.cpp ``convert_hf_to_gguf.py`` ``LlamaModel.generate_extra_tensors``: one divisor
    per frequency, computed in torch float32 as the converter does."""
    import torch

    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(torch.tensor(rope_factors, dtype=torch.float32).numpy())


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory, tiny_loaded: LoadedModel) -> dict[str, Any]:
    """The HF oracle model, its folder, and the same weights as a GGUF with rope_freqs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    c = tiny_config(max_position_embeddings=4 * ORIGINAL_CONTEXT)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False,
        max_position_embeddings=c.max_position_embeddings,
        initializer_range=0.3,
        rope_parameters={**LLAMA3, "rope_theta": c.rope_theta},
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("llama3") / "hf"
    hf.save_pretrained(folder, safe_serialization=True)
    tiny_loaded.tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    weights = {k: v.detach().to(torch.float32).numpy() for k, v in hf.state_dict().items()}
    freqs = converter_rope_freqs(c.head_dim, c.rope_theta, LLAMA3)
    gguf = write_tiny_gguf(
        folder.parent / "llama3.gguf",
        tiny_config(max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False),
        weights,
        extra_tensors={"rope_freqs.weight": freqs},
    )
    return {"hf": hf, "folder": folder, "gguf": gguf, "freqs": freqs}


def _logits(config: ModelConfig, weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    state = PagedSequences(LlamaModel(config, weights), num_pages=40, page_size=4)
    return state.all_logits(state.new_sequence(), ids)


@pytest.mark.hf
@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_llama3_rope_matches_transformers_to_twice_the_context(
    llama3: dict[str, Any], source: str
) -> None:
    loaded = load_model(llama3[source])
    assert loaded.config.rope_freq_factors is not None
    np.testing.assert_allclose(loaded.config.rope_freq_factors, llama3["freqs"], rtol=1e-6)
    # the three regimes are all exercised: kept (1), smoothed (between), divided (factor)
    f = np.asarray(loaded.config.rope_freq_factors)
    assert f[0] == 1.0 and np.any((f > 1.0) & (f < 4.0)) and f[-1] == 4.0
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 272, LENGTH)]
    want = hf_logits(llama3["hf"], ids)
    ours = _logits(loaded.config, loaded.weights, ids)
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-4)
    # plain RoPE (what the GGUF path used to run) is far off past the first positions
    plain = replace(loaded.config, rope_freq_factors=None)
    assert np.abs(_logits(plain, loaded.weights, ids)[8:] - want[8:]).max() > 1e-2


@pytest.mark.hf
def test_llama3_rope_through_the_engine_and_its_cache_namespace(llama3: dict[str, Any]) -> None:
    from tests.model.conftest import hf_greedy

    prompt = [int(i) for i in np.random.default_rng(2).integers(3, 272, 70)]
    llm = LLM(model=str(llama3["gguf"]), page_size=4, num_pages=64)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    out = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert list(out) == hf_greedy(llama3["hf"], prompt, 40)  # positions 70..109 > 64


def test_rope_scaling_is_part_of_the_prefix_cache_namespace(tiny_loaded: LoadedModel) -> None:
    base = tiny_loaded.config
    factors = tuple(float(f) for f in converter_rope_freqs(base.head_dim, base.rope_theta, LLAMA3))
    namespaces = set()
    for config in (
        base,
        replace(base, rope_scaling="llama3", rope_freq_factors=factors),
        replace(base, rope_scaling="llama3", rope_freq_factors=(*factors[:-1], 2.0)),
    ):
        engine = LLMEngine(
            EngineConfig(cache=CacheConfig(page_size=4, num_pages=8)),
            LlamaModel(config, tiny_loaded.weights),
            model_fingerprint="same-file",
        )
        namespaces.add(engine.cache_manager.namespace)
    assert len(namespaces) == 3


# ---- every other RoPE variant or unknown tensor is refused, naming it -----------------------
@pytest.mark.parametrize(
    ("extra_tensors", "message"),
    [
        ({"rope_factors_long.weight": np.ones(8)}, r"unsupported GGUF tensor 'rope_factors_long"),
        ({"blk.0.attn_q.bias": np.zeros(64)}, r"unsupported GGUF tensor 'blk.0.attn_q.bias'"),
        ({"rope_freqs.weight": np.ones(4)}, r"'rope_freqs.weight' must hold head_dim / 2 = 8"),
        ({"rope_freqs.weight": -np.ones(8)}, r"'rope_freqs.weight' must hold .* positive"),
    ],
)
def test_gguf_unknown_tensors_and_bad_rope_freqs_are_refused(
    tmp_path: Path, extra_tensors: dict[str, np.ndarray], message: str
) -> None:
    from tests.model.tiny import random_weights

    config = tiny_config()
    path = write_tiny_gguf(
        tmp_path / "x.gguf", config, random_weights(config), extra_tensors=extra_tensors
    )
    with pytest.raises(ValueError, match=message):
        load_model(path)


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ({"rope_type": "yarn", "factor": 2.0}, r"RoPE scaling 'yarn' is not supported"),
        ({"rope_type": "dynamic", "factor": 2.0}, r"RoPE scaling 'dynamic'"),
        ({"rope_type": "longrope", "factor": 2.0}, r"RoPE scaling 'longrope'"),
        (
            {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"},
            r"llama3 RoPE scaling without 'low_freq_factor'",
        ),
        ({**LLAMA3, "high_freq_factor": 0.5}, r"high_freq_factor \(0.5\) must exceed"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, r"partial RoPE"),
    ],
)
def test_hf_other_rope_variants_are_refused(
    llama3: dict[str, Any], tmp_path: Path, rope: dict[str, Any], message: str
) -> None:
    folder = _copy(llama3["folder"], tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    raw.pop("rope_scaling", None)
    raw["rope_parameters"] = {**rope, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        load_model(folder)


def test_hf_unknown_tensor_is_refused_and_matching_inv_freq_tolerated(
    llama3: dict[str, Any], tmp_path: Path
) -> None:
    from safetensors.numpy import load_file, save_file

    folder = _copy(llama3["folder"], tmp_path)
    path = next(folder.glob("*.safetensors"))
    tensors = load_file(str(path))
    loaded = load_model(llama3["folder"])
    c = loaded.config
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2) / c.head_dim))
    scaled = (inv_freq / np.asarray(c.rope_freq_factors)).astype(np.float32)
    save_file({**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": scaled}, str(path))
    # the buffer agrees with the scaled frequencies: tolerated
    assert load_model(folder).config.rope_freq_factors == loaded.config.rope_freq_factors
    unscaled = inv_freq.astype(np.float32)  # a buffer of another RoPE: refused
    save_file({**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": unscaled}, str(path))
    with pytest.raises(ValueError, match=r"unexpected tensor '.*rotary_emb.inv_freq'"):
        load_model(folder)
    bias = np.zeros(64, np.float32)
    save_file({**tensors, "model.layers.1.self_attn.q_proj.bias": bias}, str(path))
    with pytest.raises(
        ValueError, match=r"unexpected tensor 'model.layers.1.self_attn.q_proj.bias'"
    ):
        load_model(folder)


def _copy(folder: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(folder, tmp_path / "copy"))


def test_transformers_4_rope_scaling_key_gives_the_same_factors(llama3: dict[str, Any]) -> None:
    from pagedattn.model.hf_loader import hf_config

    raw = json.loads((llama3["folder"] / "config.json").read_text())
    theta = raw.get("rope_parameters", {}).get("rope_theta", raw.get("rope_theta"))
    old = {k: v for k, v in raw.items() if k != "rope_parameters"}
    old |= {"rope_theta": theta, "rope_scaling": dict(LLAMA3)}  # the transformers 4.x spelling
    config = hf_config(old, llama3["folder"])
    assert config.rope_freq_factors == load_model(llama3["folder"]).config.rope_freq_factors
    assert config.rope_scaling_key.startswith("llama3:")
