"""Attention kernels: pure functions over NumPy arrays (never the scheduler or Sequence).

``reference_attention`` is the dense oracle; ``write_kv`` / ``paged_attention_decode`` /
``paged_attention_prefill`` run over the page pool; ``merge_states`` combines partial states.
"""

import os

# Numba's parallel kernels run on GNU OpenMP, whose idle threads spin ~300k iterations after each
# parallel region by default. Between two kernels the model calls OpenBLAS, whose own threads
# then share the cores with those spinning ones: batched steps ran ~1.4x slower. A short spin
# keeps back-to-back kernels (single-stream decode) as fast and lets BLAS have the cores.
# Read when libgomp starts (the first parallel kernel), so it must be set here, before any runs;
# a value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

from pagedattn.kernels.merge import merge_states
from pagedattn.kernels.paged import (
    paged_attention_decode,
    paged_attention_prefill,
    write_kv,
)
from pagedattn.kernels.reference import reference_attention, visible_mask

__all__ = [
    "merge_states",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reference_attention",
    "visible_mask",
    "write_kv",
]
