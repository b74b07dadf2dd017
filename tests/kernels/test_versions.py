"""An untested numba / llvmlite release is refused when the kernels load, with one clear
error; the pins in pyproject.toml admit exactly the tested releases."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from pagedattn.kernels.versions import TESTED

ROOT = Path(__file__).resolve().parents[2]
IMPORT_WITH = """
import sys, numba, llvmlite
numba.__version__, llvmlite.__version__ = sys.argv[1], sys.argv[2]
import pagedattn.kernels
print("imported")
"""


def _import(numba: str, llvmlite: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    environ.pop("PAGEDATTN_ALLOW_UNTESTED_NUMBA", None)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", IMPORT_WITH, numba, llvmlite],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_untested_numba_is_refused_at_import_with_one_clear_error() -> None:
    done = _import("0.70.0", "0.50.1")
    assert done.returncode != 0 and "imported" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pagedattn's kernels are tested with numba 0.68.x")
    assert "found numba 0.70.0" in last and "llvmlite" not in last.split("found")[1].split(":")[0]
    done = _import("0.68.1", "0.44.0")
    assert done.returncode != 0 and "found llvmlite 0.44.0" in done.stderr


def test_a_tested_release_imports_and_the_override_admits_an_untested_one() -> None:
    assert _import("0.68.9", "0.50.0").stdout.strip() == "imported"
    done = _import("0.70.0", "0.50.0", PAGEDATTN_ALLOW_UNTESTED_NUMBA="1")
    assert done.stdout.strip() == "imported"
    assert "RuntimeWarning" in done.stderr and "found numba 0.70.0" in done.stderr


def test_pyproject_pins_admit_the_tested_releases_and_no_other() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {r.name: r.specifier for r in map(Requirement, project["dependencies"])}
    for name, releases in TESTED.items():
        (major, minor), *_ = releases
        assert pins[name].contains(f"{major}.{minor}.0")
        assert pins[name].contains(f"{major}.{minor}.7")
        assert not pins[name].contains(f"{major}.{minor + 1}.0")  # an upper bound
        assert not pins[name].contains(f"{major}.{minor - 1}.0")
