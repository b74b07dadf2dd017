"""`pagedattn bench generate|engine --backend numpy,torch` on the tiny model: one run measures
both backends and prints them side by side (no speed is asserted); a bad --backend exits 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.bench_engine
import pagedattn.cli.bench_generate  # noqa: F401  (register the commands)
from pagedattn.backends import BackendSpec
from pagedattn.bench.backends import parse_backends
from pagedattn.cli.app import app

runner = CliRunner()
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


def test_parse_backends_accepts_lists_repeats_and_devices() -> None:
    assert parse_backends(None) == [BackendSpec("numpy", "cpu")]
    assert parse_backends(["numpy,torch", "torch/cuda", "torch"]) == [
        BackendSpec("numpy", "cpu"),
        BackendSpec("torch", "cpu"),
        BackendSpec("torch", "cuda"),
    ]


@needs_torch
def test_bench_generate_measures_each_backend_in_one_run(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gen.json"
    args = ["bench", "generate", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--prompt-len", "40", "--output-len", "6", "--repeats", "1", "--threads", "1",
            "--backend", "numpy,torch", "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "ours per backend" in result.stdout and "torch/cpu / numpy/cpu" in result.stdout
    figures = json.loads(out.read_text())
    assert set(figures["backends"]) == {"numpy/cpu", "torch/cpu"}
    assert figures["backends"]["numpy/cpu"] == figures["ours"]
    for spec in ("numpy/cpu", "torch/cpu"):
        one = figures["backends"][spec]
        assert one["generated"] == 6 and one["prefill_tok_s"] > 0 and one["decode_tok_s"] > 0


@needs_torch
def test_bench_engine_measures_each_backend_in_one_run(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--num-requests", "4", "--min-prompt-len", "20", "--max-prompt-len", "40",
            "--output-len", "4", "--threads", "1", "--no-shared-prefix",
            "--backend", "numpy", "--backend", "torch", "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "ours per backend" in result.stdout
    runs = json.loads(out.read_text())["backends"]
    for spec in ("numpy/cpu", "torch/cpu"):
        assert runs[spec]["main"]["generated"] == 16, spec


@pytest.mark.parametrize("command", ["generate", "engine"])
def test_bad_backend_exits_2_with_one_line(tiny_gguf: Path, command: str) -> None:
    result = runner.invoke(app, ["bench", command, "-m", str(tiny_gguf), "--backend", "numpy/cuda"])
    assert result.exit_code == 2
    assert "does not run on device 'cuda'" in result.stderr and result.stderr.count("\n") == 1
