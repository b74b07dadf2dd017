"""Random pages with real chained hashes, for store tests."""

from __future__ import annotations

import numpy as np

from pagedattn.cache.hashing import cache_namespace, prefix_page_hashes
from pagedattn.storage import PageKey, StoredPage

PAGE_SHAPE = (2, 2, 2, 4, 8)  # layers, K/V, kv heads, page_size, head_dim
PAGE_SIZE = PAGE_SHAPE[3]


def namespace(model: str = "model-a") -> bytes:
    return cache_namespace(
        model_fingerprint=model,
        dtype="float32",
        page_size=PAGE_SIZE,
        num_layers=2,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
    )


def chain(token_ids: list[int], ns: bytes) -> list[PageKey]:
    """Keys of every full page of ``token_ids``."""
    hashes = prefix_page_hashes(token_ids, PAGE_SIZE, ns)
    return [
        PageKey(
            h,
            hashes[i - 1] if i else None,
            tuple(token_ids[i * PAGE_SIZE : (i + 1) * PAGE_SIZE]),
        )
        for i, h in enumerate(hashes)
    ]


def pages(token_ids: list[int], ns: bytes, seed: int = 0) -> list[StoredPage]:
    rng = np.random.default_rng(seed)
    return [
        StoredPage(k, rng.standard_normal(PAGE_SHAPE).astype(np.float32))
        for k in chain(token_ids, ns)
    ]


def all_equal(got: list[np.ndarray | None], written: list[StoredPage]) -> bool:
    """Every page was found and is bit-identical to what was written."""
    return len(got) == len(written) and all(
        g is not None and g.tobytes() == p.kv.tobytes() for g, p in zip(got, written, strict=True)
    )
