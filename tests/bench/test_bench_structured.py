"""Smoke test of `pagedattn bench structured` on the tiny random model: every constrained
output validates, both runs count the same tokens, the figures are positive. (Not timed.)"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import pagedattn.cli.bench_structured  # noqa: F401  (registers the command)
from pagedattn.cli.app import app


def test_bench_structured_reports_a_ratio(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "structured.json"
    args = ["bench", "structured", "-m", str(tiny_gguf), "--num-requests", "2",
            "--max-tokens", "600", "--page-size", "8", "--json", str(out)]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "constrained / unconstrained" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["all_valid"] is True
    assert figures["num_requests"] == 2 and figures["tokens_generated"] > 2 * 6 * 8
    for key in ("constrained_s", "unconstrained_s", "mask_s", "ratio"):
        assert figures[key] > 0
