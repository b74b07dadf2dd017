"""`pagedattn eval ppl` through typer's CliRunner on the tiny GGUF: the table, the JSON
records (full's perplexity checked against a plain prefill of the same ids), the PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from pagedattn.cli import _register
from pagedattn.cli.app import app
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from tests.model.paging import PagedSequences

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such "
    "a man may be on his first entering a neighbourhood, this truth is so well fixed."
)


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["eval", "ppl", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_eval_ppl_table_json_and_plot(tiny_gguf: Path, tmp_path: Path) -> None:
    text = tmp_path / "novel.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    code, out = _invoke(
        "--model", str(tiny_gguf), "--text", str(text), "--tokens", "80", "--page-size", "8",
        "--budget", "32,48", "--policy", "full,window,sinks,h2o,random",
        "--position-mode", "absolute,shifted", "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert code == 0, out
    records = json.loads(out_json.read_text())
    runs = [(r["policy"], r["position_mode"], r["budget"]) for r in records]
    assert runs == [
        ("full", "absolute", None),
        *[("window", "absolute", b) for b in (32, 48)],
        *[("sinks", m, b) for m in ("absolute", "shifted") for b in (32, 48)],
        *[("h2o", "absolute", b) for b in (32, 48)],
        *[("random", "absolute", b) for b in (32, 48)],
    ]
    assert all(r["tokens"] == 80 and r["peak_kv_tokens"] <= (r["budget"] or 80) for r in records)
    # full == exp(mean NLL) of one plain prefill of the same 80 ids (the test's own path)
    loaded = load_model(tiny_gguf)
    ids = loaded.tokenizer.encode(TEXT, add_special_tokens=False)[:80]
    state = PagedSequences(LlamaModel(loaded.config, loaded.weights), num_pages=16, page_size=8)
    logits = state.all_logits(state.new_sequence(), ids[:-1]).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    expected = math.exp(float(np.mean(lse - logits[np.arange(79), ids[1:]])))
    assert abs(records[0]["perplexity"] - expected) <= 1e-3 * expected
    assert "full" in out and "1.00x" in out and "sinks (shifted)" in out
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `eval report` rebuilds the table and plot from saved records (runs split over processes)
    _register()
    merged, png2 = tmp_path / "merged.json", tmp_path / "merged.png"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["eval", "report", str(out_json), "--json", str(merged), "--plot", str(png2)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(merged.read_text()) == records
    assert "sinks (shifted)" in result.output and png2.stat().st_size > 0


def test_eval_ppl_refuses_bad_options(tiny_gguf: Path) -> None:
    code, out = _invoke("--model", str(tiny_gguf), "--policy", "full,lru", "--tokens", "20")
    assert code == 1 and "policy: expected one of" in out
    code, out = _invoke("--model", str(tiny_gguf), "--budget", "32,x")
    assert code == 1 and "--budget: expected int values" in out
    code, out = _invoke("--model", str(tiny_gguf), "--policy", "h2o", "--budget", "8")
    assert code == 1 and "h2o needs at least 2 pages" in out
