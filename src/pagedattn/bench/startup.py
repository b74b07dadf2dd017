"""Start-up of ``pagedattn generate "Hi" --max-tokens 1``: cold-process wall time, first token
included, with a warm Numba kernel cache.

Each figure is the median wall time of fresh ``python`` processes run one after another, after
one warm-up run of each (which also fills the Numba cache and Python's bytecode cache when they
are cold). Beside the full
command the table shows the floors it stands on, measured in the same run: the bare interpreter,
the imports of the generate path, and one cached Numba kernel call (Numba's own import and
first-dispatch cost, which no change to this project's code removes).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

_IMPORTS = (
    "import pagedattn.cli.generate, pagedattn.engine.llm_engine, pagedattn.model.llama, "
    "pagedattn.model.loader"
)
_NUMBA_CALL = (
    "import numpy as np; from pagedattn.model.row_ops import rms_norm; "
    "rms_norm(np.ones((1, 64), np.float32), np.ones(64, np.float32), 1e-5)"
)


def generate_command(model: str | None) -> list[str]:
    """argv of ``pagedattn generate "Hi" --max-tokens 1`` run by this interpreter."""
    cmd = [sys.executable, "-c", "from pagedattn.cli import main; main()", "generate", "Hi"]
    return cmd + ["--max-tokens", "1"] + (["--model", model] if model else [])


def startup_commands(model: str | None) -> dict[str, list[str]]:
    """Row label -> argv, floors first, the full command last."""
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "imports of the generate path": [sys.executable, "-c", _IMPORTS],
        "+ one cached Numba kernel call": [sys.executable, "-c", f"{_IMPORTS}; {_NUMBA_CALL}"],
        'generate "Hi" --max-tokens 1': generate_command(model),
    }


@dataclass(frozen=True)
class StartupRow:
    """One command's wall times in seconds (median of ``runs_s``)."""

    label: str
    runs_s: list[float]

    @property
    def median_s(self) -> float:
        return float(statistics.median(self.runs_s))


def time_command(cmd: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of ``cmd`` to its exit.

    Raises:
        ChildProcessError: the command failed (its last stderr line).
    """
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        raise ChildProcessError(
            f"start-up command {cmd[-4:]} failed: {lines[-1] if lines else done.returncode}"
        )
    return wall


def measure_startup(
    model: str | None,
    *,
    repeats: int = 3,
    threads: int = 2,
    timer: Callable[[list[str], dict[str, str]], float] = time_command,
) -> list[StartupRow]:
    """Median cold-process wall time of each of :func:`startup_commands`, after one warm-up.

    Args:
        model: ``--model`` for generate (None: the embedded SmolLM2).
        repeats: timed runs of each command (>= 1).
        threads: numba / BLAS threads of the children.
        timer: runs one command and returns its wall seconds.

    Raises:
        ValueError: ``repeats`` < 1. ChildProcessError: a command failed.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    env = {**os.environ, **dict.fromkeys(_THREAD_VARS, str(threads))}
    env.setdefault("HF_HUB_OFFLINE", "1")
    # warm means Python's bytecode cache too: the warm-up writes the .pyc files an installed
    # package has (with PYTHONDONTWRITEBYTECODE every run recompiles each module's source)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rows = []
    for label, cmd in startup_commands(model).items():
        timer(cmd, env)  # warm-up: page cache, .pyc files, Numba's kernel cache
        rows.append(StartupRow(label, [timer(cmd, env) for _ in range(repeats)]))
    return rows


def startup_table(rows: list[StartupRow]) -> Any:
    """A rich Table of the rows, each with its share of the full command (the last row)."""
    from rich.table import Table

    table = Table(title="start-up: fresh process, warm Numba cache, first token included")
    for name in ("command", "median s", "runs s", "of the full command"):
        table.add_column(name, justify="left" if name == "command" else "right")
    full = rows[-1].median_s
    for row in rows:
        table.add_row(
            row.label,
            f"{row.median_s:.2f}",
            " ".join(f"{r:.2f}" for r in row.runs_s),
            f"{row.median_s / full:.0%}" if full > 0 else "-",
        )
    return table


def report_startup(
    console: Any,
    model: str | None,
    threads: int,
    repeats: int,
    timer: Callable[[list[str], dict[str, str]], float] = time_command,
) -> dict[str, Any]:
    """Measure (``timer``: as :func:`measure_startup`'s), print the table on ``console`` and
    return the figures (for ``--json``)."""
    rows = measure_startup(model, repeats=repeats, threads=threads, timer=timer)
    console.print(startup_table(rows))
    full = rows[-1]
    return {
        "rows": {row.label: row.runs_s for row in rows},
        "generate_median_s": full.median_s,
    }
