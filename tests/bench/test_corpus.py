"""The default text ships inside the package (works from a wheel, no ../shared needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pagedattn
from pagedattn.bench.corpus import corpus_token_ids, default_corpus_file
from pagedattn.model.loader import load_model


def test_default_corpus_is_package_data(tiny_gguf: Path) -> None:
    path = default_corpus_file()
    assert path.parent == Path(pagedattn.__file__).parent / "data"
    assert path.read_text(encoding="utf-8").startswith("PRIDE AND PREJUDICE")
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*.txt" in package_data["pagedattn"]
    ids = corpus_token_ids(load_model(tiny_gguf).tokenizer, None, 5000)
    assert len(ids) >= 5000
