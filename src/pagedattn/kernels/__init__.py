"""Attention kernels: pure functions over NumPy arrays (never the scheduler or Sequence).

``reference_attention`` is the dense oracle; ``write_kv`` / ``paged_attention_decode`` /
``paged_attention_prefill`` run over the page pool; ``merge_states`` combines partial states.
"""

# First, before any kernel is decorated: stamps the package's cached kernels (numba_cache.py).
from pagedattn.kernels import numba_cache  # noqa: F401

# isort: split

from pagedattn.kernels.gomp import start_numba_threads
from pagedattn.kernels.merge import merge_states
from pagedattn.kernels.paged import (
    paged_attention_decode,
    paged_attention_prefill,
    write_kv,
)
from pagedattn.kernels.reference import reference_attention, visible_mask

# Before any parallel kernel runs (libgomp reads its spin count once): see kernels/gomp.py.
start_numba_threads()

__all__ = [
    "merge_states",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reference_attention",
    "visible_mask",
    "write_kv",
]
