"""The llama.cpp peer (llama-cpp-python): its KV-size log line, and one same-run comparison on
the tiny GGUF when llama_cpp is importable (skipped otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.compare import app
from benchmarks.peers import llamacpp
from typer.testing import CliRunner


def test_llama_cpp_kv_size_line_is_parsed() -> None:
    line = (
        "llama_kv_cache: size =   16.88 MiB (   768 cells,  30 layers,  1/1 seqs), "
        "K (f16):    8.44 MiB, V (f16):    8.44 MiB"
    )  # as llama.cpp (llama-cpp-python 0.3.36) logs it while loading SmolLM2
    found = llamacpp.KV_SIZE.search("llama_context: n_ctx = 768\n" + line)
    assert found is not None and float(found.group(1)) == 16.88


def test_compare_generate_measures_llama_cpp_on_the_same_gguf(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    if not llamacpp.available():
        pytest.skip("llama_cpp (llama-cpp-python) is not importable or finds no libllama")
    corpus = tmp_path / "text.txt"
    corpus.write_text("the rain in spain stays mainly on the plain. " * 200, encoding="utf-8")
    out = tmp_path / "gen.json"
    args = ["generate", "-m", str(tiny_gguf), "--prompt-file", str(corpus), "--prompt-len", "40",
            "--output-len", "6", "--repeats", "1", "--threads", "1", "--no-hf",
            "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    peer = json.loads(out.read_text())["llamacpp"]
    assert peer["generated"] == 6 and peer["prefill_tok_s"] > 0 and peer["decode_tok_s"] > 0
    assert peer["kv_cache_mib"] > 0  # llama.cpp's own report, parsed from its load log
