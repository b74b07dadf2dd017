"""The package's imports run one way: an import graph of ``src/pagedattn`` built with ``ast``
(every ``import`` statement, at module level or inside a function) has no cycle between modules
and no edge from a layer to a layer above it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pagedattn"

#: Bottom to top: a module may import its own layer and the layers before it, never one after.
LAYERS = (
    "backend_spec",
    "config",
    "sampling_params",
    "kernels",
    "backends",
    "model",
    "cache",
    "storage",
    "engine",
    "stream",
    "eval",
    "bench",
    "server",
    "cluster",
    "cli",
)


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module name -> the pagedattn modules it imports (a ``from a import b`` of a submodule
    ``b`` counts as an import of ``a.b``)."""
    paths = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "pagedattn")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != "pagedattn":
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in paths else node.module)
        graph[name] = {t for t in targets if t != name}
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` where b's layer stands above a's (the package root, a lazy facade, is exempt)."""
    found = []
    for source, targets in sorted(graph.items()):
        if source == "pagedattn":
            continue
        for target in sorted(targets):
            low, high = layer(target), layer(source)
            if LAYERS.index(low) > LAYERS.index(high):
                found.append(f"{source} -> {target}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> Iterator[None]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                yield from visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
        yield

    for v in sorted(graph):
        if v not in index:
            for _ in visit(v):
                pass
    return found


def test_every_module_is_in_a_known_layer() -> None:
    graph = import_graph()
    unknown = sorted({layer(m) for m in graph if m != "pagedattn"} - set(LAYERS))
    assert unknown == [], f"add these to LAYERS where they belong: {unknown}"


def test_no_import_points_up_a_layer() -> None:
    assert upward_edges(import_graph()) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_checks_find_a_planted_cycle_and_an_upward_edge(tmp_path: Path) -> None:
    root = tmp_path / "pagedattn"
    (root / "kernels").mkdir(parents=True)
    (root / "engine").mkdir()
    (root / "__init__.py").write_text("")
    (root / "kernels" / "__init__.py").write_text("")
    (root / "engine" / "__init__.py").write_text("")
    (root / "kernels" / "a.py").write_text("def f():\n    from pagedattn.engine import b\n")
    (root / "engine" / "b.py").write_text("from pagedattn.kernels import a\n")
    graph = import_graph(root)
    assert graph["pagedattn.kernels.a"] == {"pagedattn.engine.b"}
    assert upward_edges(graph) == ["pagedattn.kernels.a -> pagedattn.engine.b"]
    assert cycles(graph) == [["pagedattn.engine.b", "pagedattn.kernels.a"]]


LEAVES = ("backend_spec", "config", "sampling_params")


@pytest.mark.parametrize("leaf", LEAVES)
def test_configs_are_leaves(leaf: str) -> None:
    graph = import_graph()
    modules = [m for m in graph if layer(m) == leaf]
    assert modules
    for module in modules:
        assert {layer(t) for t in graph[module]} <= set(LEAVES), module
