"""The ``KVStore`` interface and what every backend shares: checking records and counting.

A store holds full KV pages keyed by their chained prefix hash (see
:mod:`pagedattn.cache.hashing`), as records (:mod:`pagedattn.storage.record`). Backends
(:class:`~pagedattn.storage.disk.DiskStore`, :class:`~pagedattn.storage.redis_store.RedisStore`)
move raw bytes; :class:`BaseStore` encodes, decodes, checks and counts, so that a bad record
is handled the same everywhere: a miss, counted by kind, deleted, never used. Stores are
thread-safe (the engine thread reads, the write-through thread writes).
"""

from __future__ import annotations

import abc
import bisect
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.storage.record import (
    RecordError,
    decode_record,
    encode_record,
    record_nbytes,
    signing_key,
)

#: Upper bounds (seconds) of the get/put latency histograms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class StoredPage:
    """A page to write: its key and KV ``(num_layers, 2, num_kv_heads, page_size, head_dim)``."""

    key: PageKey
    kv: np.ndarray


class LatencyHistogram:
    """Cumulative latency counts over :data:`LATENCY_BUCKETS` (Prometheus histogram shape)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def snapshot(self) -> dict[str, Any]:
        """``{"buckets": [(upper_bound, cumulative_count)...] (last "+Inf"), "sum", "count"}``."""
        cumulative, acc = [], 0
        for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.counts, strict=True):
            acc += count
            cumulative.append((bound, acc))
        return {"buckets": cumulative, "sum": self.total, "count": acc}


@runtime_checkable
class KVStore(Protocol):
    """Batched page storage keyed by prefix hash (all methods take and return batches).

    ``get`` never raises for a bad or unreachable record: it is a miss (None).
    """

    namespace: bytes

    def contains(self, page_hashes: Sequence[bytes]) -> list[bool]: ...

    def get(self, keys: Sequence[PageKey]) -> list[np.ndarray | None]: ...

    def put(self, pages: Sequence[StoredPage]) -> int: ...

    def get_document(self, name: str) -> bytes | None: ...

    def put_document(self, name: str, data: bytes) -> None: ...

    def replace_document(self, name: str, old: bytes | None, new: bytes) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class BaseStore(abc.ABC):
    """Record checks and counters over a backend's raw reads and writes.

    Args:
        namespace: 16-byte cache namespace; records of another namespace are misses.
        page_shape: the KV shape of one page, ``(num_layers, 2, num_kv_heads, page_size,
            head_dim)``.
        dtype: the KV dtype (float32).
        key: shared secret (>= 16 bytes; a str is UTF-8): every record is signed with it
            (HMAC-SHA256) and only records it signed are used. None: records are unsigned and
            any record that checks out is used (see :mod:`pagedattn.storage.record`).

    Raises:
        ValueError: a namespace that is not 16 bytes, a key that is too short.
    """

    backend = "base"

    def __init__(
        self,
        namespace: bytes,
        page_shape: tuple[int, ...],
        dtype: np.dtype | type = np.float32,
        *,
        key: str | bytes | None = None,
    ) -> None:
        if len(namespace) != 16:
            raise ValueError(f"namespace: expected 16 bytes, got {len(namespace)}")
        self.namespace = namespace
        self.page_shape = tuple(page_shape)
        self.dtype = np.dtype(dtype)
        self._key = signing_key(key)
        self.signed = self._key is not None
        page_size = self.page_shape[3] if len(self.page_shape) == 5 else 0
        #: The sizes a record of one page can have, signed or not (a record of any other size
        #: is refused before it is read; an unsigned one read with a key fails its signature).
        self.record_sizes = frozenset(
            record_nbytes(self.page_shape, self.dtype, page_size, signed=signed)
            for signed in (False, True)
        )
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._get_latency = LatencyHistogram()
        self._put_latency = LatencyHistogram()

    # ---- backend hooks -----------------------------------------------------------------
    @abc.abstractmethod
    def _contains_raw(self, page_hashes: Sequence[bytes]) -> list[bool]: ...

    @abc.abstractmethod
    def _read_raw(self, page_hashes: Sequence[bytes]) -> list[bytes | None]: ...

    @abc.abstractmethod
    def _write_raw(self, items: Sequence[tuple[bytes, bytes]]) -> int: ...

    @abc.abstractmethod
    def _delete_raw(self, page_hashes: Sequence[bytes]) -> None: ...

    @abc.abstractmethod
    def _on_hits(self, page_hashes: Sequence[bytes]) -> None: ...

    def _backend_stats(self) -> dict[str, Any]:
        return {}

    # ---- the interface -----------------------------------------------------------------
    def contains(self, page_hashes: Sequence[bytes]) -> list[bool]:
        """Whether a record exists under each hash (not checked: ``get`` checks)."""
        return self._contains_raw(page_hashes) if page_hashes else []

    def get(self, keys: Sequence[PageKey]) -> list[np.ndarray | None]:
        """Read and check pages; each result is a writable copy shaped ``page_shape``, or None.

        A missing record is a miss; a record failing any check (see
        :func:`pagedattn.storage.record.decode_record`) is a miss counted under
        ``errors[kind]`` and deleted.
        """
        if not keys:
            return []
        t0 = time.perf_counter()
        raws = self._read_raw([k.page_hash for k in keys])
        out: list[np.ndarray | None] = []
        bad: list[bytes] = []
        hits: list[bytes] = []
        nbytes = 0
        for key, raw in zip(keys, raws, strict=True):
            if raw is None:
                out.append(None)
                continue
            nbytes += len(raw)
            try:
                record = decode_record(
                    raw,
                    namespace=self.namespace,
                    expected=key,
                    dtype=self.dtype,
                    shape=self.page_shape,
                    verify_with=self._key,
                )
            except RecordError as exc:
                self.count_error(exc.kind)
                bad.append(key.page_hash)
                out.append(None)
                continue
            out.append(record.kv.copy())
            hits.append(key.page_hash)
        if bad:
            self._delete_raw(bad)
        if hits:
            self._on_hits(hits)
        with self._lock:
            self._counts["pages_hit"] += len(hits)
            self._counts["pages_missed"] += len(keys) - len(hits)
            self._counts["bytes_read"] += nbytes
            self._get_latency.observe(time.perf_counter() - t0)
        return out

    def put(self, pages: Sequence[StoredPage]) -> int:
        """Write pages (an existing record of the same hash may be kept). Returns bytes written.

        Never raises for an unreachable backend (the write is lost and counted).
        """
        if not pages:
            return 0
        t0 = time.perf_counter()
        items = [
            (
                p.key.page_hash,
                encode_record(self.namespace, p.key, p.kv.astype(self.dtype), sign_with=self._key),
            )
            for p in pages
        ]
        written = self._write_raw(items)
        with self._lock:
            self._counts["pages_written"] += len(pages) if written else 0
            self._counts["bytes_written"] += written
            self._put_latency.observe(time.perf_counter() - t0)
        return written

    def count_error(self, kind: str) -> None:
        """Count one error of ``kind`` (a record check or a backend failure)."""
        with self._lock:
            self._errors[kind] += 1

    def stats(self) -> dict[str, Any]:
        """Counters: ``pages_hit``, ``pages_missed``, ``pages_written``, ``bytes_read``,
        ``bytes_written`` (ints), ``errors`` (kind -> count), ``get_latency`` /
        ``put_latency`` (:meth:`LatencyHistogram.snapshot`), ``backend``, ``up`` (bool)."""
        with self._lock:
            base: dict[str, Any] = {
                k: self._counts[k]
                for k in (
                    "pages_hit",
                    "pages_missed",
                    "pages_written",
                    "bytes_read",
                    "bytes_written",
                )
            }
            base["errors"] = dict(self._errors)
            base["get_latency"] = self._get_latency.snapshot()
            base["put_latency"] = self._put_latency.snapshot()
        base["backend"] = self.backend
        base["up"] = True
        base.update(self._backend_stats())
        return base

    def close(self) -> None:  # noqa: B027 - backends without resources keep the default
        """Release the backend's resources (idempotent)."""


def check_document_name(name: str) -> str:
    """A document name: 1-128 of ``[A-Za-z0-9._-]``, not starting with a dot.

    Raises:
        ValueError: naming the rule.
    """
    ok = 0 < len(name) <= 128 and not name.startswith(".")
    if not ok or any(not (c.isascii() and (c.isalnum() or c in "._-")) for c in name):
        raise ValueError(
            f"document name: expected 1-128 characters of [A-Za-z0-9._-] not starting with "
            f"'.', got {name!r}"
        )
    return name
