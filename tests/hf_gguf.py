"""transformers reads a GGUF three times for one model: ``AutoTokenizer``, ``AutoConfig`` and the
weights each build a ``gguf.GGUFReader`` of the same file, and a reader parses every string of
the vocabulary into its own array view (Gemma 3's 262k tokens: ~12 s and ~700 MiB each). The
suite hands transformers the last reader it built for a file while the file is unchanged (same
path, size and modification time), so an oracle model costs one parse instead of three. Only
the parse is shared: what transformers computes from it is unchanged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf

_READER = gguf.GGUFReader
#: smaller files parse in well under a second and are the ones tests rewrite in place
MIN_CACHED_BYTES = 64 << 20
_last: tuple[tuple[str, int, int, str], Any] | None = None


def cached_reader(path: os.PathLike[str] | str, mode: str = "r") -> Any:
    """``gguf.GGUFReader(path, mode)``, the previous reader when it read the same unchanged
    file in the same mode (one reader kept: the parsed fields of a large vocabulary are big).
    Files under :data:`MIN_CACHED_BYTES` are always parsed afresh."""
    global _last
    resolved = Path(path).resolve()
    stat = resolved.stat()
    if mode != "r" or stat.st_size < MIN_CACHED_BYTES:
        return _READER(path, mode)
    key = (str(resolved), stat.st_size, stat.st_mtime_ns, mode)
    if _last is None or _last[0] != key:
        _last = None  # free the previous reader before parsing the next
        _last = (key, _READER(path, mode))
    return _last[1]


def install() -> None:
    """Route ``gguf.GGUFReader(...)`` calls through :func:`cached_reader` in this process."""
    gguf.GGUFReader = cached_reader  # type: ignore[assignment,misc]
