"""The persistent KV tier below the page pool: record format, disk and Redis stores,
write-through queue. See :mod:`pagedattn.storage.record` for the format."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.storage.base import KVStore, StoredPage
from pagedattn.storage.record import RecordError, decode_record, encode_record
from pagedattn.storage.tier import KVTier

__all__ = [
    "KVStore",
    "KVTier",
    "PageKey",
    "RecordError",
    "StoredPage",
    "decode_record",
    "encode_record",
    "open_store",
]


def open_store(
    spec: str,
    namespace: bytes,
    page_shape: tuple[int, ...],
    dtype: np.dtype | type = np.float32,
    *,
    key: str | bytes | None = None,
) -> KVStore:
    """A store from ``--kv-store``: ``redis://HOST:PORT/DB`` or a directory path; ``key`` (from
    ``--kv-store-key``) signs every record and refuses unsigned or wrongly signed ones.

    Raises:
        ValueError: an empty spec, an unsupported URL scheme, a short key. OSError: the directory
            cannot be created.
    """
    if not spec:
        raise ValueError("kv_store: expected a directory or redis://HOST:PORT/DB, got ''")
    if spec.startswith("redis://"):
        from pagedattn.storage.redis_store import RedisStore

        return RedisStore(spec, namespace, page_shape, dtype, key=key)
    if "://" in spec:
        raise ValueError(f"kv_store: expected a directory or redis://HOST:PORT/DB, got {spec!r}")
    from pagedattn.storage.disk import DiskStore

    return DiskStore(Path(spec), namespace, page_shape, dtype, key=key)
