"""The server package imports one way: its init loads nothing, no module imports the package
back, the import graph of its modules has no cycle, and the protocol models load without
FastAPI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pagedattn.server

PACKAGE = "pagedattn.server"
ROOT = Path(pagedattn.server.__file__).parent


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``TYPE_CHECKING`` imports included)."""
    modules = {
        PACKAGE if p.stem == "__init__" else f"{PACKAGE}.{p.stem}": p for p in ROOT.glob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if node.module == PACKAGE:  # `from pagedattn.server import x`: the init runs
                    names.append(PACKAGE)
            else:
                continue
            graph[module] |= {n for n in names if n in modules and n != module}
    return graph


def test_the_package_init_imports_nothing_and_nothing_imports_it() -> None:
    graph = import_graph()
    assert graph[PACKAGE] == set()
    assert [m for m, deps in graph.items() if PACKAGE in deps] == []


def test_the_server_modules_have_no_import_cycle() -> None:
    graph = import_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(
                f"import cycle: {' -> '.join([*path[path.index(module) :], module])}"
            )
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_protocol_models_load_without_fastapi() -> None:
    code = (
        "import sys, pagedattn.server.protocol, pagedattn.server.prepared; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
