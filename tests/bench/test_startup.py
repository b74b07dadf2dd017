"""Start-up: the bench's start-up table, the modules the generate path imports, and
that a second `pagedattn generate` compiles no Numba kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import pagedattn.cli.bench_generate  # noqa: F401  (register the commands)
from pagedattn.bench.startup import (
    generate_command,
    measure_startup,
    report_startup,
    startup_commands,
    startup_table,
)
from pagedattn.cli.app import app

# modules the generate path must not import (each costs 0.1-several seconds)
HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "matplotlib", "redis", "gguf", "pandas")


def test_measure_startup_warms_up_then_takes_the_median_of_each_command() -> None:
    calls: list[str] = []
    walls = iter([9.0, 0.1, 0.3, 0.2, 9.0, 0.5, 0.4, 0.6, 9.0, 1.0, 1.2, 1.1, 9.0, 3.0, 1.5, 2.5])

    def timer(cmd: list[str], env: dict[str, str]) -> float:
        calls.append(cmd[-1])
        assert env["NUMBA_NUM_THREADS"] == "2" and env["OMP_NUM_THREADS"] == "2"
        return next(walls)

    rows = measure_startup("m.gguf", repeats=3, threads=2, timer=timer)
    assert [r.label for r in rows] == list(startup_commands("m.gguf"))
    # the warm-up runs (9.0) are dropped; medians by hand: 0.2, 0.5, 1.1, 2.5
    assert [r.median_s for r in rows] == [0.2, 0.5, 1.1, 2.5]
    assert len(calls) == 16 and calls[-1] == "m.gguf"
    console = Console(record=True, width=140)
    console.print(startup_table(rows))
    text = console.export_text()
    assert "2.50" in text and "100%" in text and "8%" in text  # 0.2 / 2.5 of the full command
    with pytest.raises(ValueError, match="repeats"):
        measure_startup(None, repeats=0, timer=timer)


def test_generate_command_is_the_cli_command() -> None:
    cmd = generate_command("x.gguf")
    assert cmd[0] == sys.executable and cmd[3:] == [
        "generate", "Hi", "--max-tokens", "1", "--model", "x.gguf"
    ]  # fmt: skip
    assert "--model" not in generate_command(None)


def test_bench_generate_prints_the_startup_row(tiny_gguf: Path, tmp_path: Path) -> None:
    """The real thing on the tiny GGUF: fresh processes, the table, the JSON."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("the rain in spain stays mainly on the plain. " * 50, encoding="utf-8")
    out = tmp_path / "gen.json"
    args = ["bench", "generate", "-m", str(tiny_gguf), "--prompt-file", str(prompt),
            "--prompt-len", "8", "--output-len", "2", "--repeats", "1", "--threads", "1",
            "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "start-up: fresh process" in result.stdout and 'generate "Hi"' in result.stdout
    figures = json.loads(out.read_text())["startup"]
    assert set(figures["rows"]) == set(startup_commands(None))
    assert all(len(runs) == 1 and runs[0] > 0 for runs in figures["rows"].values())
    assert figures["generate_median_s"] == figures["rows"]['generate "Hi" --max-tokens 1'][0]


@pytest.mark.parametrize(
    ("walls", "median"), [((9.0, 1.9, 1.2, 2.4), 1.9), ((9.0, 2.0, 3.1, 1.0), 2.0)]
)
def test_report_startup_takes_the_median(walls: tuple[float, ...], median: float) -> None:
    """A fixed fake timer: each command's warm-up (9.0) then three runs; the median by hand."""
    it = iter(walls * 4)
    console = Console(record=True, width=140)
    figures = report_startup(console, "m.gguf", 2, 3, timer=lambda cmd, env: next(it))
    assert figures["generate_median_s"] == median
    assert figures["rows"]['generate "Hi" --max-tokens 1'] == list(walls[1:])
    text = console.export_text()
    assert f"{median:.2f}" in text and "goal" not in text


def _run_generate(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import json, sys\n"
        "from pagedattn.cli import main\n"
        "try:\n    main()\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    cmd = [sys.executable, "-c", code, "generate", "Hi", "--max-tokens", "1", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=900)


@pytest.mark.model
def test_generate_imports_nothing_heavy_and_a_second_run_compiles_nothing() -> None:
    """Run `pagedattn generate "Hi" --max-tokens 1` twice in fresh processes with Numba's
    cache debugging on: the second run loads every kernel from the cache and saves none (a
    save means a compile), and neither imports torch, transformers, fastapi, gguf..."""
    env = {**os.environ, "NUMBA_DEBUG_CACHE": "1", "NUMBA_NUM_THREADS": "1"}
    first = _run_generate(env)  # fills the cache when it is cold
    assert first.returncode == 0, first.stderr[-2000:]
    second = _run_generate(env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip()  # the first token's text
    saved = [x for x in second.stdout.splitlines() + second.stderr.splitlines() if "saved" in x]
    assert "data loaded from" in second.stdout + second.stderr and not saved, saved[:5]
    modules = json.loads(second.stderr.strip().splitlines()[-1])
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, heavy
