"""The bench worker runs a registered entry point in a child process: a registry from outside
the package (as benchmarks/peers extends it), its progress events, its peak RSS with and
without the KV cache it reports, and a failure as one error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedattn.bench.worker import compile_note, run_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
TASKS = {
    "hold-kv": "tests.bench.worker_tasks:hold_kv",
    "no-kv": "tests.bench.worker_tasks:no_kv",
    "fail": "tests.bench.worker_tasks:fail",
}


def _run(
    task: str, args: dict[str, int], events: list[tuple[str, int, int]] | None = None
) -> dict[str, Any]:
    def progress(phase: str, done: int, total: int) -> None:
        if events is not None:
            events.append((phase, done, total))

    return run_worker(task, args, 3, progress, tasks=TASKS, pythonpath=[REPO_ROOT])


def test_a_registered_task_runs_with_its_progress_and_the_kv_taken_out_of_the_peak() -> None:
    events: list[tuple[str, int, int]] = []
    small = _run("hold-kv", {"mib": 32}, events)
    assert events == [("allocating", 0, 2), ("allocated", 1, 2), ("done", 2, 2)]
    assert small["threads_seen"] == 3 and small["sum"] == 1.0
    assert 32 <= small["kv_cache_mib"] <= 34  # 32 MiB touched, give or take a huge page
    assert small["peak_rss_mib"] >= 32
    big = _run("hold-kv", {"mib": 96})
    assert 96 <= big["kv_cache_mib"] <= 98 and big["peak_rss_mib"] >= 96
    # 64 MiB more KV: the peak grows by about that, the peak without the KV does not
    assert big["peak_rss_mib"] - small["peak_rss_mib"] >= 60
    assert abs(big["peak_rss_minus_kv_mib"] - small["peak_rss_minus_kv_mib"]) < 8
    plain = _run("no-kv", {})
    assert plain["answer"] == 42 and "peak_rss_minus_kv_mib" not in plain
    assert "kernels_compiled" not in plain  # no kernel of ours was imported


def test_unknown_task_and_a_failing_child_are_one_error_each() -> None:
    with pytest.raises(ValueError, match=r"task: expected one of \['fail', 'hold-kv', 'no-kv'\]"):
        _run("generate-ours", {})
    with pytest.raises(RuntimeError, match="'fail' failed: ValueError: the fake task failed"):
        _run("fail", {})


def test_compile_note_only_when_kernels_were_compiled() -> None:
    assert compile_note({}) is None and compile_note({"kernels_compiled": 0}) is None
    note = compile_note({"kernels_compiled": 7})
    assert note is not None and note.startswith("ours compiled 7 kernel signatures")
