"""`pagedattn bench kernels --backend`: the xp kernel's column beside the Numba kernel's, in the
same run (not timed: no speed is asserted), and backend errors as one line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import pagedattn.cli.bench_kernels  # noqa: F401  (register the command)
from pagedattn.backends import BackendSpec
from pagedattn.bench.kernels import bench_decode, interleaved_median_ms
from pagedattn.cli.app import app

runner = CliRunner()


def test_bench_decode_times_the_xp_kernel_on_each_backend() -> None:
    pytest.importorskip("torch")
    specs = [BackendSpec("numpy", "cpu"), BackendSpec("torch", "cpu")]
    r = bench_decode(2, 40, 2, backends=specs)
    assert [spec for spec, _ in r.xp_ms] == specs
    assert all(np.isfinite(ms) and ms > 0 for _, ms in r.xp_ms)
    assert r.paged_ms > 0 and bench_decode(1, 16, 1).xp_ms == ()


def test_bench_kernels_prints_the_backend_columns() -> None:
    pytest.importorskip("torch")
    args = ["bench", "kernels", "--batch", "2", "--context", "40", "--repeats", "2",
            "--backend", "torch"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "xp torch/cpu ms" in result.stdout and "x numba" in result.stdout


def test_bench_kernels_prints_read_bandwidth_and_the_targets() -> None:
    args = ["bench", "kernels", "--batch", "32", "--context", "16", "--repeats", "1"]
    result = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "read GB/s" in result.stdout and "% read" in result.stdout
    assert "batch 32, context 16: % of read-only bandwidth" in result.stdout
    r = bench_decode(2, 32, 1)
    assert r.read_gbps > 0 and r.pct_read == pytest.approx(100 * r.kv_gbps / r.read_gbps)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--backend", "jax"], "backend 'jax' is unknown"),
        (["--backend", "cupy", "--device", "cpu"], "does not run on device 'cpu'"),
    ],
)
def test_bench_kernels_bad_backend_is_one_line(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["bench", "kernels", "--batch", "1", "--context", "8", *args])
    assert result.exit_code == 2  # a backend error: see cli_errors
    assert result.stderr.startswith("error: ") and fragment in result.stderr
    assert result.stderr.count("\n") == 1


def test_interleaved_median_ms_alternates_the_timers_after_the_warmup() -> None:
    calls: list[str] = []
    timers = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    ms = interleaved_median_ms(timers, rounds=3, warmup=2)
    assert calls == ["a", "b"] * 5  # two untimed rounds, then three timed ones, in turn
    assert list(ms) == ["a", "b"] and all(v >= 0 for v in ms.values())
