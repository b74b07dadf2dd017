"""PagePool: the preallocated KV storage. Plain arrays, no policy (see allocator/manager)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PagePool:
    """One KV array ``(num_layers, 2, num_pages, num_kv_heads, page_size, head_dim)``.

    Index 0 of axis 1 holds keys, index 1 values. Each (page, kv head) is one contiguous
    ``page_size x head_dim`` tile, the layout of vLLM's / FlashInfer's paged KV cache
    (https://docs.flashinfer.ai/tutorials/kv_layout.html). A token's KV lives at
    ``slot = page_id * page_size + offset``.

    Args:
        num_layers, num_pages, num_kv_heads, page_size, head_dim: positive ints.
        dtype: storage dtype (float32 by default; the kernels compute in float32).

    Raises:
        ValueError: a size is not a positive int.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        page_size: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("num_kv_heads", num_kv_heads),
            ("page_size", page_size),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"PagePool: {name} must be a positive int, got {value!r}")
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.num_kv_heads = num_kv_heads
        self.page_size = page_size
        self.head_dim = head_dim
        self.kv = np.zeros((num_layers, 2, num_pages, num_kv_heads, page_size, head_dim), dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by the KV array."""
        return int(self.kv.nbytes)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")

    def k_cache(self, layer: int) -> np.ndarray:
        """C-contiguous view ``(num_pages, num_kv_heads, page_size, head_dim)`` of layer's keys.

        Raises:
            ValueError: layer out of range.
        """
        self._check_layer(layer)
        view: np.ndarray = self.kv[layer, 0]
        return view

    def v_cache(self, layer: int) -> np.ndarray:
        """C-contiguous view ``(num_pages, num_kv_heads, page_size, head_dim)`` of layer's values.

        Raises:
            ValueError: layer out of range.
        """
        self._check_layer(layer)
        view: np.ndarray = self.kv[layer, 1]
        return view

    def read_page(self, page_id: int) -> np.ndarray:
        """Copy of one page over all layers: ``(num_layers, 2, num_kv_heads, page_size, head_dim)``.

        Raises:
            ValueError: page_id out of range.
        """
        self._check_page(page_id)
        return self.kv[:, :, page_id].copy()

    def copy_pages(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Copy every layer's K and V of page ``src`` to page ``dst`` for each ``(src, dst)``.

        Used after :meth:`CacheManager.fork`, which returns the pairs to copy.

        Raises:
            ValueError: a page id out of range, or src == dst.
        """
        for src, dst in pairs:
            self._check_page(src)
            self._check_page(dst)
            if src == dst:
                raise ValueError(f"copy_pages: src and dst are the same page {src}")
            self.kv[:, :, dst] = self.kv[:, :, src]

    def _check_page(self, page_id: int) -> None:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page_id must be in [0, {self.num_pages}), got {page_id}")
