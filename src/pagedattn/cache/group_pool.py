"""GroupPages: one layer group's pages of the page pool, as the persistent tier reads and writes
them (the group's layers of its own page ids, never another group's)."""

from __future__ import annotations

import numpy as np

from pagedattn.cache.page_pool import PagePool


class GroupPages:
    """Pages ``0 .. num_pages - 1`` of a layer group: pool pages ``base ..`` in ``layers``.

    Args:
        pool: the engine's page pool (NumPy).
        layers: the group's model layers, ascending.
        base: the group's first page id in the pool.
        num_pages: the group's pages.

    Raises:
        ValueError: no layer, a layer or page range outside the pool.
    """

    def __init__(self, pool: PagePool, layers: tuple[int, ...], base: int, num_pages: int) -> None:
        if not layers or min(layers) < 0 or max(layers) >= pool.num_layers:
            raise ValueError(f"GroupPages: layers {layers} outside the pool's {pool.num_layers}")
        if base < 0 or num_pages < 1 or base + num_pages > pool.num_pages:
            raise ValueError(
                f"GroupPages: pages {base}..{base + num_pages - 1} outside the pool's "
                f"{pool.num_pages}"
            )
        self.pool = pool
        self.layers = np.asarray(layers, dtype=np.int64)
        self.base = base
        self.num_pages = num_pages
        self.num_layers = len(layers)
        self.num_kv_heads = pool.num_kv_heads
        self.page_size = pool.page_size
        self.row_width = pool.row_width
        self.dtype = pool.dtype

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        """One page's K and V in the group's layers."""
        return (self.num_layers, 2, self.num_kv_heads, self.page_size, self.row_width)

    def _pool_page(self, page_id: int) -> int:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page_id must be in [0, {self.num_pages}), got {page_id}")
        return self.base + page_id

    def read_page(self, page_id: int) -> np.ndarray:
        """A copy of the group's page: :attr:`page_shape` of the pool's dtype."""
        return np.array(self.pool.kv[self.layers, :, self._pool_page(page_id)])

    def write_page(self, page_id: int, kv: np.ndarray) -> None:
        """Overwrite the group's page with ``kv`` (:attr:`page_shape`, the pool's dtype).

        Raises:
            ValueError: page_id out of range, or ``kv`` of another shape or dtype.
        """
        pid = self._pool_page(page_id)
        if tuple(kv.shape) != self.page_shape or kv.dtype != self.dtype:
            raise ValueError(
                f"write_page: expected {self.dtype} {self.page_shape}, "
                f"got {kv.dtype} {tuple(kv.shape)}"
            )
        self.pool.kv[self.layers, :, pid] = kv
