"""PagePool: layout, contiguous per-layer views, pages to and from the host."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.bench.worker import resident_mib
from pagedattn.cache import PagePool


def test_layout_and_views() -> None:
    pool = PagePool(num_layers=2, num_pages=5, num_kv_heads=3, page_size=4, head_dim=8)
    assert pool.kv.shape == (2, 2, 5, 3, 4, 8) and pool.kv.dtype == np.float32
    assert pool.nbytes == 2 * 2 * 5 * 3 * 4 * 8 * 4
    k, v = pool.k_cache(1), pool.v_cache(1)
    assert k.shape == v.shape == (5, 3, 4, 8)
    assert k.flags.c_contiguous and v.flags.c_contiguous
    k[2, 1, 3] = 7.0  # a view: writes land in the pool
    assert pool.kv[1, 0, 2, 1, 3, 0] == 7.0 and pool.kv[1, 1, 2, 1, 3, 0] == 0.0
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\)"):
        pool.k_cache(2)
    with pytest.raises(ValueError, match="num_pages"):
        PagePool(1, 0, 1, 1, 1)


def _backends() -> list[str]:
    import importlib.util

    return ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


@pytest.mark.parametrize("backend", _backends())
def test_pages_cross_to_and_from_the_host_on_every_backend(backend: str) -> None:
    """read_page / write_page exchange host NumPy arrays whatever array library holds the pool
    (the storage tiers rely on it); a wrong shape or dtype names the expected one."""
    from pagedattn.backends import resolve_backend

    pool = PagePool(2, 4, 3, 2, 5, backend=resolve_backend(backend, "cpu"))
    assert type(pool.kv).__module__.split(".")[0] == backend
    page = np.random.default_rng(1).standard_normal((2, 2, 3, 2, 5)).astype(np.float32)
    pool.write_page(3, page)
    got = pool.read_page(3)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, page)
    assert not pool.read_page(0).any() and not pool.read_page(1).any()
    assert pool.nbytes == 2 * 2 * 4 * 3 * 2 * 5 * 4
    with pytest.raises(ValueError, match=r"expected float32 \(2, 2, 3, 2, 5\)"):
        pool.write_page(1, page[:, :, :2])
    with pytest.raises(ValueError, match="expected float32"):
        pool.write_page(1, page.astype(np.float64))


def test_an_int8_pool_keeps_codes_and_scales_in_one_page() -> None:
    pool = PagePool(num_layers=2, num_pages=3, num_kv_heads=2, page_size=4, head_dim=8,
                    dtype=np.int8)  # fmt: skip
    assert pool.row_width == 12 and pool.kv.shape == (2, 2, 3, 2, 4, 12)
    assert pool.nbytes == 2 * 2 * 3 * 2 * 4 * 12  # a byte a code, 4 bytes a row's scale
    page = np.arange(2 * 2 * 2 * 4 * 12, dtype=np.int64).astype(np.int8).reshape(2, 2, 2, 4, 12)
    pool.write_page(1, page)
    assert pool.read_page(1).tobytes() == page.tobytes()
    with pytest.raises(ValueError, match=r"write_page: expected int8 \(2, 2, 2, 4, 12\)"):
        pool.write_page(0, page[..., :8].copy())
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        PagePool(1, 1, 1, 4, 6, dtype=np.int8)


@pytest.mark.skipif(resident_mib(np.zeros(1)) is None, reason="needs Linux's /proc/self/pagemap")
def test_a_page_costs_memory_only_once_written() -> None:
    # SmolLM2-135M's pool at the default 256 MiB budget: 30 layers, 3 KV heads, head_dim 64
    pool = PagePool(num_layers=30, num_pages=364, num_kv_heads=3, page_size=16, head_dim=64)
    assert pool.nbytes == 30 * 2 * 364 * 3 * 16 * 64 * 4  # 256 MiB reserved
    assert resident_mib(pool.kv) == 0.0
    for page in (0, 1, 2):  # three pages written in every layer, as a short prompt does
        pool.write_page(page, np.ones((30, 2, 3, 16, 64), np.float32))
    # each (layer, K or V) holds a page in 3 * 16 * 64 * 4 bytes = 12 KiB (three 4 KiB pages):
    # 30 * 2 * 3 pages of 12 KiB = 2.11 MiB resident, not the pool (nor a 2 MiB huge page each)
    assert resident_mib(pool.kv) == pytest.approx(30 * 2 * 3 * 12 / 1024)
    np.testing.assert_array_equal(pool.read_page(1), np.ones((30, 2, 3, 16, 64), np.float32))
    assert not pool.kv[:, :, 3:].any()  # the rest reads as zeros
    assert pool.kv.flags.c_contiguous and pool.kv.flags.writeable
