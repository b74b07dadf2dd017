"""`python benchmarks/compare.py generate`: our side through the package's bench worker, the
peers through benchmarks/peers, in one run, with same-run ratios and named comparisons. (Not
timed: no speed is asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.compare import app
from benchmarks.peers import llamacpp
from typer.testing import CliRunner

REPO_ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_compare_generate_without_peers_says_each_is_not_measured(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gen.json"
    args = ["generate", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--prompt-len", "24", "--output-len", "3", "--repeats", "1", "--threads", "1",
            "--no-hf", "--no-llamacpp", "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert set(json.loads(out.read_text())) == {"ours"}
    assert json.loads(out.read_text())["ours"]["generated"] == 3
    assert "llama.cpp: not measured" in result.stdout
    rows = [x for x in result.stdout.splitlines() if " vs " in x and "not measured:" in x]
    # decode vs llama.cpp, prefill vs HF and vs llama.cpp, RSS minus KV
    assert len(rows) == 4  # every comparison of the generate run, none with a number
    assert "issue" not in result.stdout.lower()


def test_compare_runs_as_a_script_from_the_repository_root() -> None:
    """The documented command line: the script puts the repository root on its own path."""
    done = subprocess.run(
        [sys.executable, "benchmarks/compare.py", "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in ("generate", "engine", "gpu"))


@pytest.mark.hf
def test_compare_generate_with_hf_on_the_tiny_gguf(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "gen.json"
    args = ["generate", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--prompt-len", "24", "--output-len", "3", "--repeats", "1", "--threads", "1",
            "--no-llamacpp", "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    hf, ours = figures["hf"], figures["ours"]
    for key in ("prefill_tok_s", "decode_tok_s", "peak_rss_mib"):
        assert hf[key] > 0
    ratio = ours["prefill_tok_s"] / hf["prefill_tok_s"]
    row = next(x for x in result.stdout.splitlines() if "prefill tok/s vs HF transformers" in x)
    assert f"{ratio:.2f}x" in row and "met" not in row
    # the exact path agrees with HF: same first token, same greedy continuation
    assert "fidelity vs HF transformers float32" in result.stdout
    assert ours["greedy_ids"] == hf["greedy_ids"] and len(hf["greedy_ids"]) == 3
    shared = set(hf["first_logprobs"]) & set(ours["first_logprobs"])
    assert len(shared) >= 10
    for token in shared:
        assert abs(hf["first_logprobs"][token] - ours["first_logprobs"][token]) < 1e-3
    if not llamacpp.available():
        assert "llama.cpp: not measured" in result.stdout
