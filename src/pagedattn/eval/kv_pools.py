"""KV pools of the perplexity lab in each storage dtype, and KV budgets given in bytes.

A pool is what :meth:`pagedattn.model.llama.LlamaModel.forward` reads: one array of the model's
``kv_shape`` in the dtype's storage. A budget in bytes becomes a page budget the same way for
every dtype: ``pages = bytes // page_bytes``, where ``page_bytes`` is what one page of the pool
occupies (all layers' K and V), so at equal bytes a narrower dtype holds more pages.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from pagedattn.kernels.kv_dtype import POOL_DTYPES

KV_CACHE_DTYPES = tuple(d.name for d in POOL_DTYPES)  # what the model's KV pool may hold

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def check_kv_cache_dtype(dtype: str, option: str = "kv_cache_dtype") -> str:
    """``dtype`` if a KV pool may hold it.

    Raises:
        ValueError: another name, naming ``option`` and the dtypes there are.
    """
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"{option}: expected one of {', '.join(KV_CACHE_DTYPES)}, got {dtype!r}")
    return dtype


def make_pool(model: Any, num_pages: int, page_size: int, dtype: str) -> np.ndarray:
    """A zeroed KV pool of ``num_pages`` pages for ``model`` in ``dtype``.

    Raises:
        ValueError: an unknown dtype.
    """
    check_kv_cache_dtype(dtype)
    # an int8 pool's rows hold codes and a scale: the model knows their width
    return np.zeros(model.kv_shape(num_pages, page_size, dtype), np.dtype(dtype))


def page_bytes(model: Any, page_size: int, dtype: str) -> int:
    """Bytes one page of ``model``'s pool occupies in ``dtype`` (every layer's K and V)."""
    return int(make_pool(model, 1, page_size, dtype).nbytes)


def parse_bytes(value: str, option: str = "budget-bytes") -> int:
    """``"1MiB"`` -> 1048576: an integer or decimal count with an optional unit (B, KiB, MiB,
    GiB, kB, MB; case-insensitive).

    Raises:
        ValueError: anything else, or a size under one byte, naming ``option``.
    """
    match = _SIZE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"--{option}: expected a size such as 512KiB or 2MiB, got {value!r}")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"--{option}: expected at least 1 byte, got {value!r}")
    return size


def bytes_to_token_budget(budget_bytes: int, model: Any, page_size: int, dtype: str) -> int:
    """The token budget (whole pages x ``page_size``) that ``budget_bytes`` buys in ``dtype``.

    Raises:
        ValueError: the bytes hold no page.
    """
    per_page = page_bytes(model, page_size, dtype)
    pages = budget_bytes // per_page
    if pages < 1:
        raise ValueError(
            f"--budget-bytes: {budget_bytes} bytes hold no {dtype} page of {per_page} bytes"
        )
    return pages * page_size
