"""compare.py engine's llama.cpp batched peer (llama-batched-bench) with a stand-in binary that
records its arguments and prints a result line in llama-batched-bench's jsonl format."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from benchmarks.compare import app
from benchmarks.peers.llamacpp import measure_batched
from typer.testing import CliRunner

# one result row as llama-batched-bench --output-format jsonl prints it (b4000+ llama.cpp)
ROW = {"n_kv_max": 4096, "pp": 40, "tg": 4, "pl": 2, "n_kv": 88, "t_pp": 0.5, "speed_pp": 160.0,
       "t_tg": 0.25, "speed_tg": 32.0, "t": 0.75, "speed": 117.3}  # fmt: skip


def _fake(tmp_path: Path, exit_code: int = 0) -> Path:
    exe = tmp_path / "llama-batched-bench"
    args_file = tmp_path / "args.json"
    exe.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(args_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "print('main: loading model')\n"
        f"print({json.dumps(json.dumps(ROW))})\n"
        f"sys.stderr.write('boom\\n'); sys.exit({exit_code})\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_measure_batched_runs_the_shape_and_reports_end_to_end(tmp_path: Path) -> None:
    exe = _fake(tmp_path)
    out = measure_batched(str(exe), "m.gguf", 40, 4, 2, 3)["main"]
    args = json.loads((tmp_path / "args.json").read_text())
    assert args[args.index("-npp") + 1] == "40" and args[args.index("-ntg") + 1] == "4"
    assert args[args.index("-npl") + 1] == "2" and args[args.index("-t") + 1] == "3"
    assert int(args[args.index("-c") + 1]) >= 2 * (40 + 4)
    assert out["generated"] == 8  # 2 sequences x 4 tokens
    assert out["generated_tok_s"] == pytest.approx(8 / 0.75)  # prefill included, as ours
    assert out["decode_tok_s"] == 32.0 and out["prefill_tok_s"] == 160.0


def test_measure_batched_refuses_a_missing_or_failing_binary(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        measure_batched(str(tmp_path / "nope"), "m.gguf", 40, 4, 2, 1)
    with pytest.raises(RuntimeError, match=r"exit 3.*boom"):
        measure_batched(str(_fake(tmp_path, exit_code=3)), "m.gguf", 40, 4, 2, 1)


def test_compare_engine_prints_the_batched_peer_and_its_comparison(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text("the rain in spain stays mainly on the plain. " * 200, encoding="utf-8")
    args = ["engine", "-m", str(tiny_gguf), "--prompt-file", str(corpus),
            "--num-requests", "2", "--min-prompt-len", "36", "--max-prompt-len", "44",
            "--output-len", "4", "--threads", "1", "--batch-size", "2", "--no-hf",
            "--no-llamacpp", "--llama-batched-bench", str(_fake(tmp_path)),
            "--json", str(tmp_path / "e.json")]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "llama-batched-bench bs=2" in result.stdout
    ran = json.loads((tmp_path / "args.json").read_text())
    assert 36 <= int(ran[ran.index("-npp") + 1]) <= 44  # the mean prompt of this run
    figures = json.loads((tmp_path / "e.json").read_text())
    ours = figures["ours"]["main"]["generated_tok_s"]
    ratio = ours / figures["llamacpp_batched"]["main"]["generated_tok_s"]
    assert f"{ratio:.2f}x" in result.stdout  # ours / llama.cpp batched
    row = next(x for x in result.stdout.splitlines() if "vs llama.cpp (llama-batched-bench)" in x)
    assert f"{ratio:.2f}x" in row and "met" not in row
    hf_row = next(x for x in result.stdout.splitlines() if "tok/s vs HF transformers" in x)
    assert "not measured: HF transformers did not run" in hf_row
