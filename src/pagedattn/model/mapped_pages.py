"""Hand back the pages of a memory-mapped model file that the process has read and will not
read again.

A GGUF's tensors are views of one read-only mapping of the file (:mod:`.gguf_header`); a page
read through it stays in the process's resident set until the file is unmapped, even when
what was read now lives elsewhere: the parsed header (vocabulary, merges) and every tensor the
loader copies (:func:`.gguf_loader.gguf_weights`: the repacked 32-input block formats, q/k
rows reordered, the float tensors). ``madvise
(MADV_DONTNEED)`` on a read-only file mapping drops those pages from the process and nothing
else: the data stay in the file (and the page cache), and a later read maps them again.
"""

from __future__ import annotations

import mmap

import numpy as np

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)  # absent on Windows


def _mapped(view: np.ndarray) -> tuple[np.ndarray, mmap.mmap] | None:
    """(the array over the whole mapping, the mapping) of a view of an ``mmap``, or None."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    buffer = root.base
    owner = buffer.obj if isinstance(buffer, memoryview) else buffer
    return (root, owner) if isinstance(owner, mmap.mmap) else None


def file_array(view: np.ndarray) -> np.ndarray | None:
    """The uint8 array over the whole mapping ``view`` is a view of, or None when ``view``
    does not view an ``mmap`` (through ``np.frombuffer`` and views of it)."""
    mapped = _mapped(view)
    return mapped[0] if mapped is not None and mapped[0].dtype == np.uint8 else None


def release_pages(view: np.ndarray) -> int:
    """Drop from this process the memory pages that lie wholly inside ``view``, a C-contiguous
    view of a memory-mapped file (edge pages shared with neighbouring data are kept).

    Returns:
        Bytes released (0 where ``view`` is not such a view or the platform has no
        ``madvise``).
    """
    mapped = _mapped(view)
    if mapped is None or _DONTNEED is None or not view.flags.c_contiguous:
        return 0
    root, mapping = mapped
    start = int(view.ctypes.data) - int(root.ctypes.data)
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + int(view.nbytes)) // mmap.PAGESIZE * mmap.PAGESIZE
    if end <= first:
        return 0
    mapping.madvise(_DONTNEED, first, end - first)
    return end - first
