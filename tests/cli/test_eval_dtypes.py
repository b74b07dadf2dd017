"""`pagedattn eval ppl` with a KV dtype axis, byte budgets and llama-perplexity's chunks, through
typer's CliRunner on the tiny GGUF. Oracles: plain float32 prefills of the same ids (the test's
own paged path) and page bytes derived by hand from the tiny model's shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pagedattn.cli import _register
from pagedattn.cli.app import app
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.cli.test_eval import TEXT
from tests.model.paging import PagedSequences

# The tiny model: 2 layers x (K, V) x 2 kv heads x 8 tokens x head_dim 16 per page of 8 tokens.
PAGE = 8
PAGE_ELEMENTS = 2 * 2 * 2 * PAGE * 16  # 1024: 4096 bytes in float32, 2048 in float16


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    result = CliRunner(env={"COLUMNS": "240"}).invoke(app, ["eval", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _nll(logits: np.ndarray, targets: list[int]) -> np.ndarray:
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    out: np.ndarray = lse - x[np.arange(len(targets)), targets]
    return out


def _prefill_nll(gguf: Path, ids: list[int]) -> np.ndarray:
    """NLL of ids[1:] from one float32 prefill of ids[:-1] (PagedSequences, not the lab)."""
    loaded = load_model(gguf)
    state = PagedSequences(LlamaModel(loaded.config, loaded.weights), num_pages=16, page_size=PAGE)
    return _nll(state.all_logits(state.new_sequence(), ids[:-1]), ids[1:])


def test_dtype_axis_and_byte_budgets(tiny_gguf: Path, tmp_path: Path) -> None:
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    # 16 KiB: 16384 / 4096 = 4 float32 pages (32 tokens), 16384 / 2048 = 8 float16 pages (64)
    code, out = _invoke(
        "ppl", "--model", str(tiny_gguf), "--text", str(text), "--tokens", "80",
        "--page-size", str(PAGE), "--policy", "full,sinks", "--position-mode", "absolute",
        "--budget", "32", "--budget-bytes", "16KiB", "--kv-cache-dtype", "float32,float16",
        "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert code == 0, out
    records = json.loads(out_json.read_text())
    runs = [(r["kv_cache_dtype"], r["policy"], r["budget"], r.get("budget_bytes")) for r in records]
    assert runs == [
        ("float32", "full", None, None),
        ("float32", "sinks", 32, None),
        ("float32", "sinks", 32, 16384),
        ("float16", "full", None, None),
        ("float16", "sinks", 32, None),
        ("float16", "sinks", 64, 16384),
    ]
    for r in records:
        assert r["page_bytes"] == PAGE_ELEMENTS * (4 if r["kv_cache_dtype"] == "float32" else 2)
        assert r["peak_kv_tokens"] <= (r["budget"] or 80) and r["activations"] == "float32"
    ids = load_model(tiny_gguf).tokenizer.encode(TEXT, add_special_tokens=False)[:80]
    expected = math.exp(float(_prefill_nll(tiny_gguf, ids).mean()))
    full32, full16 = records[0]["perplexity"], records[3]["perplexity"]
    assert abs(full32 - expected) <= 1e-3 * expected
    # float16 KV: rounded keys and values, close to float32 but not the float32 pool
    assert abs(full16 - expected) <= 1e-2 * expected and full16 != full32
    # One table: a row per (policy, dtype), the byte column says the tokens each dtype bought
    code, out = _invoke("report", str(out_json), "--plot", str(tmp_path / "report.png"))
    assert code == 0, out
    assert "KV dtype" in out and "budget 32" in out and "budget 16 KiB" in out
    sinks16 = next(line for line in out.splitlines() if "sinks" in line and "float16" in line)
    assert "@ 64 tok" in sinks16 and f"{records[5]['perplexity']:.2f}" in sinks16
    sinks32 = next(line for line in out.splitlines() if "sinks" in line and "float32" in line)
    assert "@ 32 tok" in sinks32
    assert f"({full16 / full32:.2f}x)" in out  # ratios against float32's full cache
    # Without float32's byte-budget run, its 32-token run fills the 16 KiB cell (4 pages)
    part = tmp_path / "part.json"
    part.write_text(json.dumps([r for i, r in enumerate(records) if i != 2]))
    code, out = _invoke("report", str(part))
    assert code == 0, out
    sinks32 = next(line for line in out.splitlines() if "sinks" in line and "float32" in line)
    assert sinks32.count(f"{records[1]['perplexity']:.2f}") == 2 and "@ 32 tok" in sinks32
    code, out = _invoke("report", str(out_json), "--markdown")
    assert code == 0 and "| policy | KV dtype | budget 32 | budget 16 KiB |" in out
    assert f"| sinks | float16 | {records[4]['perplexity']:.2f} (" in out
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chunks_method_scores_second_halves(tiny_gguf: Path, tmp_path: Path) -> None:
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "chunks.json"
    code, out = _invoke(
        "ppl", "--model", str(tiny_gguf), "--text", str(text), "--tokens", "80",
        "--page-size", str(PAGE), "--policy", "full", "--method", "chunks",
        "--chunk-tokens", "32", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    (record,) = json.loads(out_json.read_text())
    assert (record["method"], record["chunks"], record["tokens"]) == ("chunks", 2, 64)
    ids = load_model(tiny_gguf).tokenizer.encode(TEXT, add_special_tokens=False)[:80]
    # By hand: chunks ids[0:32] and ids[32:64], each from an empty cache; logits at positions
    # 16 .. 30 against the next token: 2 x 15 scored tokens
    scored = [_prefill_nll(tiny_gguf, ids[k * 32 : (k + 1) * 32])[16:31] for k in range(2)]
    expected = math.exp(float(np.concatenate(scored).mean()))
    assert abs(record["perplexity"] - expected) <= 1e-3 * expected
    assert "chunks of 32" in out


def test_eval_refuses_bad_dtype_bytes_and_method(tiny_gguf: Path) -> None:
    base = ("ppl", "--model", str(tiny_gguf), "--tokens", "20")
    code, out = _invoke(*base, "--kv-cache-dtype", "float32,bfloat8")
    assert code == 1 and "--kv-cache-dtype: expected one of float32, float16" in out
    assert "bfloat8" in out
    code, out = _invoke(*base, "--budget-bytes", "2XB")
    assert code == 1 and "--budget-bytes: expected a size" in out
    code, out = _invoke(*base, "--budget-bytes", "1KiB", "--policy", "sinks")
    assert code == 1 and "1024 bytes hold no float32 page of 8192 bytes"  # page size 16 in out
    code, out = _invoke(*base, "--method", "chunks", "--policy", "full,sinks")
    assert code == 1 and "--method chunks: scores the full cache only" in out
    code, out = _invoke(*base, "--method", "sliding")
    assert code == 1 and "--method: expected one of stream, chunks" in out


def test_activations_int8_is_recorded(tiny_gguf: Path, tmp_path: Path) -> None:
    from pagedattn.model.int8_ir import int8_unsupported

    if int8_unsupported() is not None:
        pytest.skip(str(int8_unsupported()))
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "int8.json"
    code, out = _invoke(
        "ppl", "--model", str(tiny_gguf), "--text", str(text), "--tokens", "40",
        "--policy", "full", "--activations", "int8", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    (record,) = json.loads(out_json.read_text())
    ids = load_model(tiny_gguf).tokenizer.encode(TEXT, add_special_tokens=False)[:40]
    exact = math.exp(float(_prefill_nll(tiny_gguf, ids).mean()))
    assert record["activations"] == "int8" and "activations int8" in out
    # int8 activations meet block-quantized weights only; the tiny GGUF's are float32
    assert abs(record["perplexity"] - exact) <= 1e-3 * exact


def test_int8_pool_at_equal_bytes(tiny_gguf: Path, tmp_path: Path) -> None:
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "int8.json"
    # An int8 row is head_dim codes + a 4-byte scale: 2 x 2 x 2 x 8 x (16 + 4) = 1280 bytes per
    # page, so 8 KiB buy 8192 // 1280 = 6 pages (48 tokens) against float32's 2 (16 tokens)
    code, out = _invoke(
        "ppl", "--model", str(tiny_gguf), "--text", str(text), "--tokens", "80",
        "--page-size", str(PAGE), "--policy", "full,window", "--budget-bytes", "8KiB",
        "--kv-cache-dtype", "int8,float32", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    records = json.loads(out_json.read_text())
    assert [(r["kv_cache_dtype"], r["budget"], r["page_bytes"]) for r in records] == [
        ("int8", None, 1280),
        ("int8", 48, 1280),
        ("float32", None, 4 * PAGE_ELEMENTS),
        ("float32", 16, 4 * PAGE_ELEMENTS),
    ]
    ids = load_model(tiny_gguf).tokenizer.encode(TEXT, add_special_tokens=False)[:80]
    expected = math.exp(float(_prefill_nll(tiny_gguf, ids).mean()))
    full8 = records[0]["perplexity"]
    assert abs(full8 - expected) <= 2e-2 * expected and full8 != records[2]["perplexity"]
