"""The console-script entry point: the command's output and exit code are kept, and the
interpreter's final garbage collections are left nothing to walk (``gc.freeze`` on the way out)."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import atexit, gc, sys
atexit.register(lambda: sys.stderr.write(f"FROZEN {gc.get_freeze_count()}\\n"))
sys.argv = ["pagedattn", *sys.argv[1:]]
from pagedattn.cli import main
main()
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=120
    )


def test_main_keeps_output_and_exit_code_and_freezes_the_heap() -> None:
    ok = _run("--help")
    assert ok.returncode == 0 and "generate" in ok.stdout
    frozen = int(ok.stderr.split("FROZEN ")[1].split()[0])
    assert frozen > 10_000  # every module's objects, not a handful
    bad = _run("generate", "--no-such-option")
    assert bad.returncode == 2 and "No such option" in bad.stderr
    assert "FROZEN " in bad.stderr  # frozen on an error exit too
