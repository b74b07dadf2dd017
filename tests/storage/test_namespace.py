"""The namespace keys the persistent tier: every field that changes KV bits changes it, and a
model folder's fingerprint covers its tokenizer by content (not its file name)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pagedattn.cache.hashing import cache_namespace
from pagedattn.model.loader import load_model
from tests.server.tiny_folder import write_tiny_folder

BASE: dict[str, Any] = dict(
    model_fingerprint="m",
    dtype="float32",
    page_size=16,
    num_layers=2,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
)


def test_every_field_changes_the_namespace() -> None:
    variants = [
        {},
        {"model_fingerprint": "m2"},
        {"dtype": "float16"},
        {"page_size": 8},
        {"num_layers": 3},
        {"num_kv_heads": 1},
        {"head_dim": 32},
        {"rope_theta": 500000.0},
        {"rope_scaling": "linear:2"},
        {"sliding_window": 64},
        {"sliding_window": 64, "num_sink_tokens": 4},
        {"sliding_window": 64, "position_mode": "shifted"},
        {"backend": "torch"},
        {"device": "cuda"},
        {"layout_version": 2},
    ]
    namespaces = {cache_namespace(**{**BASE, **v}) for v in variants}
    assert len(namespaces) == len(variants)
    assert cache_namespace(**BASE) == cache_namespace(**BASE)  # stable


def test_folder_fingerprint_covers_the_tokenizer_by_content(tmp_path: Path) -> None:
    folder = write_tiny_folder(tmp_path / "a")
    renamed = tmp_path / "renamed"
    shutil.copytree(folder, renamed)
    first = load_model(folder).fingerprint
    assert load_model(renamed).fingerprint == first  # the name is not part of it
    cfg = renamed / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("{", '{"x": 1, ', 1))
    assert load_model(renamed).fingerprint != first  # a changed tokenizer file is
