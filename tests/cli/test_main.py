"""The console-script entry point: the command's output and exit code are kept, and the
interpreter's final garbage collections are left nothing to walk (``gc.freeze`` on the way out)."""

from __future__ import annotations

import json
import subprocess
import sys

from pagedattn.cli import COMMAND_MODULES

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


REGISTRY = """
import importlib, json, pkgutil
import pagedattn.cli
from pagedattn.cli import COMMAND_MODULES
from pagedattn.cli.app import app

def names():  # the commands, and the groups that have commands
    groups = [g.name for g in app.registered_groups if g.typer_instance.registered_commands]
    return [c.name for c in app.registered_commands] + groups

found = {}
order = [m for modules in COMMAND_MODULES.values() for m in modules]
others = [m.name for m in pkgutil.iter_modules(pagedattn.cli.__path__) if m.name not in order]
for module in dict.fromkeys(order + others):
    before = set(names())
    importlib.import_module(f"pagedattn.cli.{module}")
    found[module] = sorted(set(names()) - before)
print(json.dumps(found))
"""


def test_command_modules_name_every_command_and_the_modules_that_register_it() -> None:
    """Typer's own registry, filled one module at a time in a fresh process: the names of
    COMMAND_MODULES are exactly the top-level commands and groups (a group counted when it gets
    its first command) of every module of the package, and each name's modules are the ones
    that register it."""
    done = subprocess.run(
        [sys.executable, "-c", REGISTRY], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    registered: dict[str, list[str]] = json.loads(done.stdout)
    by_name = {name: module for module, names in registered.items() for name in names}
    assert set(by_name) == set(COMMAND_MODULES)
    for name, modules in COMMAND_MODULES.items():
        assert by_name[name] in modules, (name, by_name[name])


def test_a_command_imports_only_its_own_command_modules() -> None:
    """`pagedattn generate --help` registers generate alone (typer builds the parser of every
    registered command before it dispatches); `pagedattn --help` lists every command."""
    child = CHILD.replace(
        "main()",
        "try:\n    main()\nfinally:\n"
        "    print('MODULES', *sorted(m for m in sys.modules if m.startswith('pagedattn.cli.')),"
        " file=sys.stderr)",
    )
    done = subprocess.run(
        [sys.executable, "-c", child, "generate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "PROMPT" in done.stdout, done.stderr[-2000:]
    [line] = [x for x in done.stderr.splitlines() if x.startswith("MODULES ")]
    imported = {m.rsplit(".", 1)[1] for m in line.split()[1:]}
    others = {m for modules in COMMAND_MODULES.values() for m in modules} - {"generate"}
    assert "generate" in imported and not imported & others, sorted(imported & others)
    listed = _run("--help").stdout
    assert all(f" {name} " in listed for name in COMMAND_MODULES), listed
