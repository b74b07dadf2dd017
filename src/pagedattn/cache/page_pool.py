"""PagePool: the preallocated KV storage. Plain arrays, no policy (see allocator/manager)."""

from __future__ import annotations

import mmap
import sys
from typing import Any

import numpy as np

from pagedattn.backends import BackendSpec, array_module
from pagedattn.kernels.kv_dtype import pool_row_width
from pagedattn.kernels.kv_int8 import INT8


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed, writable, C-contiguous array whose memory becomes resident page by page as it
    is written: an anonymous mapping the kernel fills with zeros on first touch, in 4 KiB pages.

    ``np.zeros`` is lazy as well, but NumPy advises transparent huge pages for large arrays, so
    the first write into each 2 MiB of the pool would make all of it resident (a short prompt
    would cost each layer's K and V a huge page); here the mapping asks for small pages. On
    Linux the mapping reserves no swap (``MAP_NORESERVE``): a hybrid KV cache's pool spans more
    page ids than its budget (each layer group's rows of the others' ids are never written),
    and the kernel's overcommit heuristic would refuse the whole span at once.
    """
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if sys.platform == "linux":  # reserve no swap up front: only written pages cost memory
        flags |= getattr(mmap, "MAP_NORESERVE", 0x4000)
    buffer = mmap.mmap(-1, nbytes, flags=flags)
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)  # Linux only
    if advice is not None:
        buffer.madvise(advice)
    return np.frombuffer(buffer, dtype).reshape(shape)  # the array keeps the mapping alive


class PagePool:
    """One KV array ``(num_layers, 2, num_pages, num_kv_heads, page_size, head_dim)``.

    Index 0 of axis 1 holds keys, index 1 values. Each (page, kv head) is one contiguous
    ``page_size x head_dim`` tile, the layout of vLLM's / FlashInfer's paged KV cache
    (https://docs.flashinfer.ai/tutorials/kv_layout.html). A token's KV lives at
    ``slot = page_id * page_size + offset``. An int8 pool's rows are ``head_dim + 4`` wide
    (``row_width``): the codes, then the row's float32 scale (:mod:`pagedattn.kernels.kv_int8`),
    so a page, its copy and its stored record hold codes and scales together. On NumPy the
    array's memory is reserved, not resident: a page costs memory once it is written
    (:func:`lazy_zeros`), so a short prompt costs its own pages, not the pool's budget.

    Args:
        num_layers, num_pages, num_kv_heads, page_size, head_dim: positive ints.
        dtype: storage dtype (float32 by default; the kernels compute in float32), a NumPy
            dtype; on another backend the same-named dtype of its library. int8 (quantized
            pages) is NumPy only.
        backend: which array library and device hold the array (:mod:`pagedattn.backends`);
            None is NumPy on the host. Whatever the backend, :meth:`read_page` and
            :meth:`write_page` exchange host NumPy arrays, so the storage tiers and the cache
            bookkeeping never see a device array.

    Raises:
        ValueError: a size is not a positive int, or int8 on another backend than NumPy or
            with a head_dim that is not a multiple of 4.
        pagedattn.backends.BackendError: the backend's library is not installed.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        page_size: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
        backend: BackendSpec | None = None,
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
        self.backend = backend or BackendSpec("numpy", "cpu")
        self.dtype = np.dtype(dtype)
        if self.dtype == INT8 and self.backend.name != "numpy":
            raise ValueError(
                f"PagePool: dtype int8 (quantized KV pages) needs the numpy backend, "
                f"got {self.backend.name}"
            )
        self.row_width = pool_row_width(self.dtype, head_dim)
        shape = (num_layers, 2, num_pages, num_kv_heads, page_size, self.row_width)
        xp = array_module(self.backend)
        if self.backend.name == "numpy":
            self.kv: Any = lazy_zeros(shape, self.dtype)  # resident once written
        elif self.backend.name == "torch":
            self.kv = xp.zeros(
                shape, dtype=getattr(xp, self.dtype.name), device=self.backend.device
            )
        else:
            self.kv = xp.zeros(shape, dtype=self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by the KV array."""
        return int(np.prod(self.kv.shape)) * self.dtype.itemsize

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")

    def k_cache(self, layer: int) -> Any:
        """C-contiguous view ``(num_pages, num_kv_heads, page_size, row_width)`` of layer's keys
        (an array of the pool's backend).

        Raises:
            ValueError: layer out of range.
        """
        self._check_layer(layer)
        return self.kv[layer, 0]

    def v_cache(self, layer: int) -> Any:
        """C-contiguous view ``(num_pages, num_kv_heads, page_size, row_width)`` of layer's values
        (an array of the pool's backend).

        Raises:
            ValueError: layer out of range.
        """
        self._check_layer(layer)
        return self.kv[layer, 1]

    def read_page(self, page_id: int) -> np.ndarray:
        """Host NumPy copy of one page over all layers:
        ``(num_layers, 2, num_kv_heads, page_size, row_width)`` of the pool's dtype.

        Raises:
            ValueError: page_id out of range.
        """
        self._check_page(page_id)
        page = self.kv[:, :, page_id]
        if self.backend.name == "numpy":
            return np.array(page)
        from pagedattn.backends.arrays import to_host  # torch / cupy extras only

        return np.array(to_host(page))  # a copy the pool never aliases

    def write_page(self, page_id: int, kv: np.ndarray) -> None:
        """Overwrite page ``page_id`` (all layers) with host array ``kv``.

        Args:
            kv: ``(num_layers, 2, num_kv_heads, page_size, row_width)`` of the pool's dtype.

        Raises:
            ValueError: page_id out of range, or ``kv`` of another shape or dtype.
        """
        self._check_page(page_id)
        expected = (self.num_layers, 2, self.num_kv_heads, self.page_size, self.row_width)
        if tuple(kv.shape) != expected or kv.dtype != self.dtype:
            raise ValueError(
                f"write_page: expected {self.dtype} {expected}, got {kv.dtype} {tuple(kv.shape)}"
            )
        if self.backend.name == "numpy":
            self.kv[:, :, page_id] = kv
        else:
            from pagedattn.backends.arrays import to_backend  # torch / cupy extras only

            self.kv[:, :, page_id] = to_backend(kv, self.backend)

    def _check_page(self, page_id: int) -> None:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page_id must be in [0, {self.num_pages}), got {page_id}")
