"""Bad per-family metadata is refused at load with an error naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedattn.model.loader import load_model
from tests.model.families import WINDOW, hf_model, save_folder, write_gguf

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("gemma-bad")
    tokenizer_json = root / "tokenizer.json"
    load_model(tiny_gguf).tokenizer.backend.save(str(tokenizer_json))
    return save_folder(hf_model("gemma3"), root / "hf", tokenizer_json)


def _edit(folder: Path, tmp: Path, **changes: Any) -> Path:
    out = tmp / "edited"
    out.mkdir()
    for f in folder.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sliding_window": 0}, r"sliding window must be a positive int, got 0"),
        ({"sliding_window": 100_000}, r"sliding window 100000 exceeds the context length 256"),
        ({"layer_types": ["full_attention"] * 5}, r"layer_types has 5 entries for 6 layers"),
        ({"layer_types": ["chunked_attention"] * 6}, r"layer_types \['chunked_attention'\]"),
        ({"hidden_activation": "relu"}, r"hidden activation 'relu' is not supported"),
        ({"model_type": "gpt_neox"}, r"unsupported architecture 'gpt_neox'"),
    ],
)
def test_bad_hf_metadata_is_named(
    gemma_folder: Path, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_model(_edit(gemma_folder, tmp_path, **changes))


def test_bad_gguf_metadata_and_tensors_are_named(tmp_path: Path) -> None:
    hf = hf_model("gemma3")
    good = write_gguf("gemma3", hf, tmp_path / "good.gguf")
    assert load_model(good).config.layer_windows == (WINDOW,) * 5 + (0,)
    hf.config.sliding_window = 0
    with pytest.raises(ValueError, match=r"gemma3.attention.sliding_window: sliding window must"):
        load_model(write_gguf("gemma3", hf, tmp_path / "zero.gguf"))
    hf.config.sliding_window = 10_000
    with pytest.raises(ValueError, match=r"sliding window 10000 exceeds the context length 256"):
        load_model(write_gguf("gemma3", hf, tmp_path / "wide.gguf"))
    # a Qwen2 GGUF whose layer-1 q bias has the wrong length: the tensor is named
    import torch

    qwen = hf_model("qwen2")
    qwen.model.layers[1].self_attn.q_proj.bias = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(ValueError, match=r"'model.layers.1.self_attn.q_proj.bias' has shape"):
        load_model(write_gguf("qwen2", qwen, tmp_path / "qwen.gguf"))
