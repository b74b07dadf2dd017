"""`pagedattn demo` through typer's CliRunner: exit code and the printed measurements."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from pagedattn.cli import _register
from pagedattn.cli.app import app
from pagedattn.stream.demo import run_demo


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["demo", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _row(output: str, label: str) -> list[float]:
    line = next(line for line in output.splitlines() if label in line)
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[-+]\d+)?", line.split(label)[1])]


def test_demo_window_and_sinks() -> None:
    code, out = _invoke(
        "--tokens", "120", "--page-size", "8", "--max-pages", "6",
        "--sliding-window", "24", "--sinks", "4", "--num-heads", "4", "--num-kv-heads", "2",
        "--head-dim", "16",
    )  # fmt: skip
    assert code == 0, out
    assert _row(out, "pages resident (max / limit)") == [5, 6]  # ceil(24/8) + 1 + 1 sink page
    assert _row(out, "pages evicted") == [11]  # pages 1..11 of 0..14; 0 and 12..14 stay
    assert _row(out, "tokens attended per step (min / mean / max)")[::2] == [1, 28]
    assert _row(out, "max abs error vs dense reference")[0] <= 1e-5
    assert "all steps match the dense reference" in out


def test_demo_lru_without_window_evicts() -> None:
    code, out = _invoke(
        "--tokens", "40", "--page-size", "4", "--max-pages", "3", "--sliding-window", "0",
        "--num-heads", "2", "--num-kv-heads", "1", "--head-dim", "8",
    )  # fmt: skip
    assert code == 0, out
    assert _row(out, "pages resident (max / limit)") == [3, 3]
    assert _row(out, "pages evicted") == [40 // 4 - 3]
    assert _row(out, "tokens attended per step (min / mean / max)")[::2] == [1, 12]


def test_demo_reports_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedattn.stream import kv_stream as stream

    real_step = stream.KVStream.step

    def off_by_a_bit(self: stream.KVStream, q, k, v):  # type: ignore[no-untyped-def]
        return real_step(self, q, k, v) + 1e-4

    monkeypatch.setattr(stream.KVStream, "step", off_by_a_bit)
    code, out = _invoke("--tokens", "5", "--head-dim", "8", "--num-heads", "3")
    assert code == 1
    assert "max abs error 0.0001 > 1e-05" in out
    report = run_demo(tokens=3, head_dim=8, num_heads=3)
    assert not report.ok and len(report.failures) == 3


def test_demo_rejects_bad_head_split() -> None:
    code, out = _invoke("--num-heads", "4", "--num-kv-heads", "3")
    assert code == 2 and "multiple" in out


def test_demo_on_torch_matches_the_reference() -> None:
    pytest.importorskip("torch")
    code, out = _invoke(
        "--tokens", "60", "--page-size", "4", "--max-pages", "5", "--sliding-window", "10",
        "--sinks", "3", "--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "8",
        "--backend", "torch", "--device", "cpu",
    )  # fmt: skip
    assert code == 0, out
    assert "backend torch/cpu" in out and "all steps match the dense reference" in out
    assert _row(out, "max abs error vs dense reference")[0] <= 1e-5
    assert _row(out, "pages evicted")[0] > 0


def test_demo_bad_backend_is_one_line() -> None:
    _register()
    result = CliRunner().invoke(app, ["demo", "--backend", "numpy", "--device", "cuda"])
    assert result.exit_code == 2  # a backend error: see cli_errors
    assert result.stderr == (
        "error: backend 'numpy' does not run on device 'cuda' (use --backend torch or cupy "
        "for cuda)\n"
    )
