"""`pagedattn eval ppl` on a tiny Gemma 3 GGUF (sliding layers of window 8 beside a full one):
by default the policies that run per layer group, in absolute positions, each record with its
groups' peaks; h2o and shifted positions refused naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_eval import TEXT, _invoke


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.model.families import gguf_with_oracle

    return gguf_with_oracle("gemma3", tmp_path_factory.mktemp("gemma3-cli"))[1]


def test_defaults_run_per_layer_group(gemma_gguf: Path, tmp_path: Path) -> None:
    text, out_json = tmp_path / "novel.txt", tmp_path / "out.json"
    text.write_text(TEXT, encoding="utf-8")
    code, out = _invoke(
        "--model", str(gemma_gguf), "--text", str(text), "--tokens", "40", "--page-size", "4",
        "--budget", "16", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    records = json.loads(out_json.read_text())
    runs = [(r["policy"], r["position_mode"]) for r in records]
    assert runs == [("full", "absolute"), ("window", "absolute"), ("sinks", "absolute"),
                    ("random", "absolute")]  # fmt: skip
    for r in records:
        assert [g["name"] for g in r["kv_groups"]] == ["full", "sliding_8"]
        assert [g["num_layers"] for g in r["kv_groups"]] == [1, 5]
    assert "sliding_8" in out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--policy", "h2o"], "'h2o'"),
        (["--policy", "sinks", "--position-mode", "shifted"], "shifted"),
    ],
)
def test_what_cannot_run_per_group_is_refused(
    gemma_gguf: Path, tmp_path: Path, flags: list[str], named: str
) -> None:
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    args = ["--model", str(gemma_gguf), "--text", str(text), "--tokens", "40", "--budget", "16"]
    code, out = _invoke(*args, "--page-size", "4", *flags)
    assert code != 0 and named in out and "sliding windows" in out, out
