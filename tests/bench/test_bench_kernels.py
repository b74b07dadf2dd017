"""`pagedattn bench kernels --backend`: the xp kernel's column beside the Numba kernel's, in the
same run (not timed: no speed is asserted), and backend errors as one line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import pagedattn.cli.bench_kernels  # noqa: F401  (register the command)
from pagedattn.backends import BackendSpec
from pagedattn.bench.kernel_comparisons import kernel_comparisons
from pagedattn.bench.kernels import DecodeResult, bench_decode, interleaved_median_ms
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


def test_bench_kernels_prints_read_bandwidth_and_the_named_comparisons() -> None:
    args = ["bench", "kernels", "--batch", "32", "--context", "16", "--repeats", "1"]
    result = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "read GB/s" in result.stdout and "% read" in result.stdout
    assert "same-run comparisons of the paged kernel" in result.stdout
    assert "float32 KV, batch 32, context 16" in result.stdout
    assert "vs read pass (% of its GB/s)" in result.stdout
    for word in ("issue", "target", "goal", "met"):
        assert word not in result.stdout.lower().split()


def test_kernel_comparisons_are_the_measured_figures() -> None:
    assert kernel_comparisons(85.0, 1.2) == [
        ("vs read pass (% of its GB/s)", "85%"),
        ("vs torch SDPA (speedup)", "1.20x"),
    ]
    assert kernel_comparisons(79.6, None)[1] == (
        "vs torch SDPA (speedup)",
        "not measured: torch absent",
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_bench_decode_counts_the_bytes_of_the_pool_dtype(dtype: str) -> None:
    r = bench_decode(3, 40, 1, kv_cache_dtype=dtype)
    row = {"float32": 64 * 4, "float16": 64 * 2, "int8": 64 + 4}[dtype]  # int8: codes + scale
    kv_bytes = 2 * 3 * 40 * 3 * row  # K and V: batch x context x kv_heads x row bytes
    assert r.kv_gbps * r.paged_ms * 1e6 == pytest.approx(kv_bytes)
    assert r.read_gbps > 0 and r.copy_gbps > 0


def test_bench_kernels_prints_a_section_per_kv_dtype() -> None:
    args = ["bench", "kernels", "--batch", "32", "--context", "16", "--repeats", "1",
            "--kv-cache-dtype", "float32", "--kv-cache-dtype", "float16"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    for dtype in ("float32", "float16"):
        assert f"{dtype} KV, batch 32, context 16" in result.stdout


def test_bench_kernels_times_the_dtypes_interleaved() -> None:
    args = ["bench", "kernels", "--batch", "32", "--context", "2048", "--repeats", "1",
            "--kv-cache-dtype", "float16", "--kv-cache-dtype", "int8"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "decode attention by KV dtype, interleaved" in result.stdout
    line = next(x for x in result.stdout.splitlines() if "int8 vs float16 (decode speed)" in x)
    cells = [c.strip() for c in line.split("│") if c.strip()]
    assert cells[-1].endswith("x") and float(cells[-1][:-1]) > 0 and "met" not in line


def test_kv_dtype_comparisons_are_speeds_over_float16() -> None:
    from pagedattn.bench.kv_dtypes import kv_dtype_comparisons

    rows = kv_dtype_comparisons({"float16": 2.8, "int8": 2.0, "float32": 4.0})
    # by hand: 2.8 / 2.0 = 1.40, 2.8 / 4.0 = 0.70
    assert rows == [
        ("int8 vs float16 (decode speed)", "1.40x"),
        ("float32 vs float16 (decode speed)", "0.70x"),
    ]
    assert kv_dtype_comparisons({"int8": 1.0}) == []


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--backend", "jax"], 2, "backend 'jax' is unknown"),
        (["--backend", "cupy", "--device", "cpu"], 2, "does not run on device 'cpu'"),
        (["--kv-cache-dtype", "bfloat16"], 1, "--kv-cache-dtype: expected one of"),
        (["--kv-cache-dtype", "float16", "--backend", "numpy"], 1, "float32 pools only"),
        (["--kv-cache-dtype", "int8", "--backend", "numpy"], 1, "float32 pools only"),
    ],
)
def test_bench_kernels_bad_option_is_one_line(args: list[str], code: int, fragment: str) -> None:
    result = runner.invoke(app, ["bench", "kernels", "--batch", "1", "--context", "8", *args])
    assert result.exit_code == code  # a backend error exits 2, a bad value 1: see cli_errors
    assert result.stderr.startswith("error: ") and fragment in result.stderr
    assert result.stderr.count("\n") == 1


def test_interleaved_median_ms_alternates_the_timers_after_the_warmup() -> None:
    calls: list[str] = []
    timers = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    ms = interleaved_median_ms(timers, rounds=3, warmup=2)
    assert calls == ["a", "b"] * 5  # two untimed rounds, then three timed ones, in turn
    assert list(ms) == ["a", "b"] and all(v >= 0 for v in ms.values())


def test_decode_result_ratios_by_hand() -> None:
    # 8 GB/s of KV against a 10 GB/s read pass and a 16 GB/s copy; SDPA 2 ms against 0.5 ms
    r = DecodeResult(1, 16, paged_ms=0.5, kv_gbps=8.0, copy_gbps=16.0, read_gbps=10.0, torch_ms=2.0)
    assert (r.pct_read, r.pct_copy, r.speedup) == (80.0, 50.0, 4.0)
    assert replace(r, torch_ms=None).speedup is None
