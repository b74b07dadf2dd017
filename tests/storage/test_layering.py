"""The storage tier sits below the engine and above the cache: storage imports cache, never the
reverse (the cache names pages with :class:`pagedattn.cache.hashing.PageKey` and reaches the
tier through the :class:`pagedattn.cache.tier_pages.PageTier` protocol)."""

from __future__ import annotations

import ast
from pathlib import Path

import pagedattn


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_cache_never_imports_storage() -> None:
    cache = Path(pagedattn.__file__).parent / "cache"
    offenders = {
        path.name: sorted(m for m in _imports(path) if m.startswith("pagedattn.storage"))
        for path in sorted(cache.glob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_page_key_is_the_cache_s() -> None:
    from pagedattn.cache.hashing import PageKey
    from pagedattn.storage import PageKey as StoragePageKey

    assert StoragePageKey is PageKey and PageKey.__module__ == "pagedattn.cache.hashing"
