"""Smoke tests of the benchmark commands on the tiny random model with tiny sizes: the table
prints, every figure is positive, the counts add up. (Not timed: no speed is asserted.)"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pagedattn.cli.bench_engine
import pagedattn.cli.bench_generate  # noqa: F401  (register the commands)
from pagedattn.bench.corpus import sample_prompts, shared_prefix_prompts
from pagedattn.bench.cpu import cpu_features
from pagedattn.bench.worker import resident_mib
from pagedattn.cli.app import app

runner = CliRunner()


def test_bench_generate_prints_table_and_positive_figures(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "gen.json"
    args = ["bench", "generate", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--prompt-len", "40", "--output-len", "6", "--repeats", "1", "--threads", "1",
            "--no-startup", "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "bench generate: tiny.gguf" in result.stdout and "prefill tok/s" in result.stdout
    assert "CPU features:" in result.stdout
    # our side only: no peer ran, none is named, no issue either
    for word in ("HF", "llama.cpp", "issue", "target"):
        assert word not in result.stdout, word
    figures = json.loads(out.read_text())
    assert set(figures) == {"ours"}
    ours = figures["ours"]
    assert ours["generated"] == 6 and len(ours["greedy_ids"]) == 6
    for key in ("prefill_tok_s", "decode_tok_s", "prefill_s", "peak_rss_mib", "kv_cache_mib"):
        assert ours[key] > 0
    # kernels compiled in the measured process (a cold Numba cache) are said when reported
    compiled = ours["kernels_compiled"]
    assert ("kernel signatures in the measured process" in result.stdout) == (compiled > 0)


def test_resident_mib_counts_only_the_touched_pages() -> None:
    # A fresh anonymous mapping: np.zeros may reuse a freed heap chunk and zero it by hand
    # (glibc calloc), which touches every page, depending on what ran before in the process.
    region = mmap.mmap(-1, 64 << 20)  # 64 MiB, mapped but never touched
    pool = np.frombuffer(region, np.float32)
    untouched = resident_mib(pool)
    assert untouched is not None and untouched < 4  # at most a huge page or two
    pool[: 16 << 18] = 1.0  # touch 16 MiB
    touched = resident_mib(pool)
    assert touched is not None and 16 <= touched <= 20


def test_bench_engine_counts_every_token_and_prefix_hits(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--num-requests", "5", "--min-prompt-len", "36", "--max-prompt-len", "60",
            "--output-len", "4", "--threads", "1", "--max-num-seqs", "2",
            "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "bench engine: tiny.gguf" in result.stdout and "gen tok/s" in result.stdout
    assert "CPU features:" in result.stdout
    for word in ("HF", "llama.cpp", "issue", "target"):
        assert word not in result.stdout, word
    assert "prefix caching on vs off (50% shared prefix): " in result.stdout
    figures = json.loads(out.read_text())["ours"]
    for run in ("main", "shared_on", "shared_off"):
        assert figures[run]["generated"] == 5 * 4
        assert figures[run]["generated_tok_s"] > 0 and figures[run]["requests_s"] > 0
    # With at most 2 sequences a step, later requests find the common prefix pages cached.
    assert figures["shared_on"]["cached_tokens"] > 0
    assert figures["shared_off"]["cached_tokens"] == 0
    compiled = figures["kernels_compiled"]  # said exactly when not 0, as in bench generate
    assert ("kernel signatures in the measured process" in result.stdout) == (compiled > 0)


def test_bench_engine_compares_kv_dtypes_on_the_same_budget(
    tiny_gguf: Path, prompt_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "-m", str(tiny_gguf), "--prompt-file", str(prompt_file),
            "--num-requests", "4", "--min-prompt-len", "20", "--max-prompt-len", "28",
            "--output-len", "4", "--threads", "1", "--page-size", "4", "--kv-cache-mib", "0.2",
            "--no-shared-prefix", "--kv-cache-dtype", "int8", "--compare-kv-dtype", "float16",
            "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    # tiny model: 2 layers, 2 KV heads, head_dim 16; a page of 4 tokens is 2*2*2*4*rows bytes
    mib = int(0.2 * 2**20)
    assert figures["ours"]["main"]["num_pages"] == mib // (2 * 2 * 2 * 4 * (16 + 4))
    assert figures["kv_float16"]["main"]["num_pages"] == mib // (2 * 2 * 2 * 4 * 16 * 2)
    assert figures["kv_float16"]["main"]["generated"] == figures["ours"]["main"]["generated"]
    assert "the same requests on 0.2 MiB of KV, per KV dtype" in result.stdout
    line = next(x for x in result.stdout.splitlines() if "int8 vs float16 KV" in x)
    ratio = (
        figures["ours"]["main"]["generated_tok_s"]
        / figures["kv_float16"]["main"]["generated_tok_s"]
    )
    assert line.rstrip().endswith(f"{ratio:.2f}x") and "goal" not in line


def test_bench_engine_bad_sizes_are_one_line_errors(tiny_gguf: Path) -> None:
    result = runner.invoke(app, ["bench", "engine", "-m", str(tiny_gguf), "--num-requests", "0"])
    assert result.exit_code == 1
    assert result.stderr == "error: --num-requests: expected an int >= 1, got 0\n"


def test_prompt_sampling_is_disjoint_and_shared_prefix_is_half() -> None:
    ids = list(range(1000))
    prompts = sample_prompts(ids, 4, 10, 30, seed=3)
    assert [len(p) for p in prompts] == [len(p) for p in sample_prompts(ids, 4, 10, 30, seed=3)]
    flat = [t for p in prompts for t in p]
    assert flat == ids[: len(flat)] and all(10 <= len(p) <= 30 for p in prompts)
    prefix = list(range(5000, 5015))
    shared = shared_prefix_prompts(prompts, prefix)
    for p, s in zip(prompts, shared, strict=True):
        half = len(p) // 2
        assert s == prefix[:half] + p[half:]
    with pytest.raises(ValueError, match=r"corpus: 20 tokens, expected >= \d+"):
        sample_prompts(ids[:20], 4, 10, 30, seed=3)


def test_cpu_features_read_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx2 fma avx512f avx512_vnni amx_tile\n")
    assert cpu_features(info) == ["AVX2", "FMA", "AVX-512", "AVX512-VNNI", "AMX"]
    info.write_text("flags : fpu sse sse2\n")
    assert cpu_features(info) == []
    assert cpu_features(tmp_path / "absent") == ["unknown"]


def test_bench_spec_runs_on_the_activations_asked_for_and_stays_lossless() -> None:
    """The embedded SmolLM2 (the bench's prompts are longer than the tiny model's context)."""
    import pagedattn.cli.bench_spec  # noqa: F401  (register the command)

    args = ["bench", "spec", "--rounds", "1", "--max-tokens", "6", "--threads", "1",
            "--activations", "int8"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "bench spec: 1 threads, activations int8," in result.stdout
    # grounded, free chat and the five grounded tasks, each marked identical or DIFFER
    rows = [line for line in result.stdout.splitlines() if line.endswith(("identical", "DIFFER"))]
    assert len(rows) == 7 and all(row.endswith("identical") for row in rows), result.stdout
    bad = runner.invoke(app, [*args[:-1], "int4"], env={"COLUMNS": "200"})
    assert bad.exit_code != 0 and "activations" in bad.output
