"""`pagedattn bench store` on the tiny model: both tiers restore every full prompt page, the
tables print, every figure is positive. (Not timed: no speed is asserted.)"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import pagedattn.cli.bench_store  # noqa: F401  (registers the command)
from pagedattn.cli.app import app
from tests.redis_server import RedisServer

runner = CliRunner()


def test_bench_store_table(tiny_gguf: Path, tmp_path: Path, redis_server: RedisServer) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the rain in spain stays mainly on the plain. " * 50, encoding="utf-8")
    out = tmp_path / "store.json"
    args = ["bench", "store", "-m", str(tiny_gguf), "--prompt-file", str(text),
            "--prompt-len", "60", "--page-size", "4", "--repeats", "1", "--threads", "1",
            "--redis", redis_server.url, "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "restored from disk" in result.stdout and "restored from redis" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["prompt_tokens"] == 60
    assert figures["rows"]["recompute"]["cached_tokens"] == 0
    for tier in ("disk", "redis"):
        assert figures["rows"][tier]["cached_tokens"] == 56  # (60 - 1) // 4 * 4
        assert figures["rows"][tier]["ttft_s"] > 0
        assert figures["write"][tier]["pages"] == 15 and figures["write"][tier]["bytes_s"] > 0
    assert figures["raw_write_bytes_s"] > 0
    compiled = figures["kernels_compiled"]  # said exactly when not 0, as in bench generate
    assert ("kernel signatures in the measured process" in result.stdout) == (compiled > 0)


def test_bench_store_without_redis_skips_its_row_and_says_how_to_add_it(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the rain in spain stays mainly on the plain. " * 50, encoding="utf-8")
    out = tmp_path / "store.json"
    args = ["bench", "store", "-m", str(tiny_gguf), "--prompt-file", str(text),
            "--prompt-len", "20", "--page-size", "4", "--repeats", "1", "--threads", "1",
            "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "restored from disk" in result.stdout and "restored from redis" not in result.stdout
    assert "redis: not measured; add --redis redis://HOST:PORT/DB" in result.stdout
    figures = json.loads(out.read_text())
    assert set(figures["rows"]) == {"recompute", "disk"} and set(figures["write"]) == {"disk"}
    assert figures["rows"]["disk"]["cached_tokens"] == 16  # (20 - 1) // 4 * 4
