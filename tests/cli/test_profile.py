"""`pagedattn profile` on the tiny GGUF: the phase report, the unfused per-op mode (same logits
as the fused forward), the cProfile dump, and the sweep's table."""

from __future__ import annotations

import json
import pstats
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from pagedattn.bench.unfused import UnfusedProfiler
from pagedattn.cli import _register
from pagedattn.cli.app import app
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["profile", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_unfused_forward_gives_the_fused_logits(tiny_gguf: Path) -> None:
    loaded = load_model(tiny_gguf)
    model = LlamaModel.from_loaded(loaded)
    unfused = UnfusedProfiler(model)
    page_size, n = 4, 11
    ids = np.random.default_rng(0).integers(3, loaded.config.vocab_size, size=n + 1)
    kv_a = np.zeros(model.kv_shape(8, page_size), np.float32)
    kv_b = kv_a.copy()
    tables = np.asarray([[5, 2, 7, 0]], np.int32)

    def batch(start: int, count: int) -> ForwardBatch:
        pos = np.arange(start, start + count)
        return ForwardBatch(
            input_ids=ids[start : start + count],
            positions=pos,
            slot_mapping=tables[0, pos // page_size].astype(np.int64) * page_size + pos % page_size,
            query_start_loc=np.asarray([0, count], np.int32),
            context_lens=np.asarray([start + count], np.int32),
            page_tables=tables,
            logits_indices=np.arange(count),
        )

    for start, count in ((0, n), (n, 1)):  # a prefill, then a decode step
        fused = model.forward(batch(start, count), kv_a)
        timed = unfused.forward(batch(start, count), kv_b)
        np.testing.assert_array_equal(fused, timed)
    np.testing.assert_array_equal(kv_a, kv_b)
    assert set(unfused.by_op) == {
        "rope",
        "embedding",
        "norm",
        "matmul",
        "lm_head",
        "attention",
        "activation",
    }
    assert sorted(unfused.by_layer) == [0, 1]


def test_profile_reports_phases_latency_and_writes_cprofile(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    dump, out_json = tmp_path / "steps.prof", tmp_path / "p.json"
    code, out = _invoke(
        "--model", str(tiny_gguf), "--prompt-len", "20", "--max-tokens", "6", "--unfused",
        "--cprofile", str(dump), "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    for phase in ("scheduling", "batch build", "model forward", "sampling", "detokenization"):
        assert phase in out
    assert "unfused profiling mode" in out and "per-token latency p50" in out
    figures = json.loads(out_json.read_text())
    assert figures["prefix_hit_ratio"] == 0.0 and figures["peak_pages"] == 2  # 25 KV tokens
    assert figures["p99_s"] >= figures["p50_s"] > 0
    stats = pstats.Stats(str(dump))
    assert any("forward" in fn[2] for fn in stats.stats)  # type: ignore[attr-defined]


def test_sweep_table(tiny_gguf: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "sweep.json"
    code, out = _invoke(
        "--model", str(tiny_gguf), "--workload", "engine", "--num-requests", "3",
        "--prompt-len", "24", "--max-tokens", "4", "--sweep", "page_size=4,8",
        "--sweep", "num_pages=20,40", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    rows = json.loads(out_json.read_text())
    assert [(r["page_size"], r["num_pages"]) for r in rows] == [
        ("4", 20),
        ("4", 40),
        ("8", 20),
        ("8", 40),
    ]
    for r in rows:
        ps = int(r["page_size"])
        # 2 layers x (K, V) x 2 kv heads x page_size x head_dim 16 x 4 bytes per page
        assert r["kv_mib"] * 2**20 == r["num_pages"] * 2 * 2 * 2 * ps * 16 * 4
        assert 0 < r["peak_pages"] <= r["num_pages"]
        assert 0 < r["prefix_hit_ratio"] < 1  # the shared first half of later prompts hits
    best = [r for r in rows if r["best"]]
    assert len(best) == 1 and best[0]["throughput_tok_s"] == max(
        r["throughput_tok_s"] for r in rows
    )
    assert "best" in out and out.count("*") >= 1


def test_sweep_refuses_unknown_keys(tiny_gguf: Path) -> None:
    code, out = _invoke("--model", str(tiny_gguf), "--sweep", "pagesize=4")
    assert code == 1 and "--sweep: key 'pagesize' not one of" in out
