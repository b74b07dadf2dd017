"""RedisStore: pages as Redis strings, shared by every server pointed at the same Redis.

Keys are ``<key_prefix>:<namespace hex>:page:<hash hex>`` (one prefix per namespace, so
models never mix and ``SCAN`` can list one model's pages) with a TTL; documents are
``<key_prefix>:doc:<name>``. Batches go out as non-transactional pipelines of at most
``batch_pages`` commands (one round trip each, as LMCache's Redis connector batches). Every
socket operation has an explicit timeout and no retry; a connection error or timeout opens a
:class:`CircuitBreaker`: the tier then answers "miss" (reads) or drops (writes) at once until
the cool-down has passed, so a dead or stalled Redis costs a request at most one timeout, and
the tier comes back by itself with Redis. A key holding another Redis type (a list, a hash) is
a bad record like any other: counted (``wrong_type``), deleted, a miss. Values are read with a
bounded ``GETRANGE`` (at most one byte more than the largest record, or than a document may
have): a value of any other size is counted (``size``), deleted, a miss, and never read whole,
whatever was written at a page's name. Deploy Redis with
``maxmemory`` and ``maxmemory-policy allkeys-lru``; an evicted key is a plain miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np

from pagedattn.storage.base import BaseStore, check_document_name
from pagedattn.storage.breaker import CircuitBreaker
from pagedattn.storage.documents import (
    MAX_DOCUMENT_BYTES,
    DocumentConflictError,
    DocumentTooLargeError,
    check_document_size,
)


def _redis_module() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - the redis extra is missing
        raise ValueError(
            "--kv-store redis://...: needs the 'redis' package (pip install 'pagedattn[store]')"
        ) from exc
    return redis


class RedisStore(BaseStore):
    """Pages in Redis (see the module doc).

    Args:
        url: ``redis://HOST:PORT/DB``.
        namespace: 16-byte cache namespace; page_shape, dtype: the KV of one page.
        ttl_s: seconds a page lives after its last write (>= 1).
        timeout_s: connect and read/write timeout of every socket operation (> 0).
        cooldown_s: how long the breaker stays open after a failure.
        key_prefix: first part of every key.
        batch_pages: most commands per pipeline round trip (a SmolLM2-135M page is 720 KiB).
        key: the shared signing key (see :class:`~pagedattn.storage.base.BaseStore`).

    Raises:
        ValueError: a URL that is not ``redis://``, a bad ttl or timeout.
    """

    backend = "redis"

    def __init__(
        self,
        url: str,
        namespace: bytes,
        page_shape: tuple[int, ...],
        dtype: np.dtype | type = np.float32,
        *,
        ttl_s: int = 7 * 24 * 3600,
        timeout_s: float = 0.5,
        cooldown_s: float = 2.0,
        key_prefix: str = "pagedattn",
        batch_pages: int = 8,
        key: str | bytes | None = None,
    ) -> None:
        super().__init__(namespace, page_shape, dtype, key=key)
        if urlparse(url).scheme != "redis":
            raise ValueError(f"kv_store: expected redis://HOST:PORT/DB, got {url!r}")
        if not isinstance(ttl_s, int) or ttl_s < 1:
            raise ValueError(f"ttl_s: expected an int >= 1, got {ttl_s!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0, got {timeout_s!r}")
        redis = _redis_module()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        if batch_pages < 1:
            raise ValueError(f"batch_pages: expected >= 1, got {batch_pages}")
        self.batch_pages = batch_pages
        self.url = url
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.prefix = f"{key_prefix}:{namespace.hex()}:page:"
        self.doc_prefix = f"{key_prefix}:doc:"
        self.breaker = CircuitBreaker(cooldown_s)
        self._errors_caught = (redis.exceptions.RedisError, OSError)
        self.client = redis.Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )

    def key(self, page_hash: bytes) -> str:
        """The Redis key of a page hash."""
        return self.prefix + page_hash.hex()

    # ---- remote calls through the breaker ------------------------------------------------
    def _call(self, commands: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any] | None:
        """Run commands in pipelines of at most :attr:`batch_pages` commands each (so that one
        round trip moves a bounded number of bytes); None when the breaker is open or a
        pipeline failed (then the whole call is a miss / a lost write).

        A command Redis refuses (e.g. ``GET`` on a key holding a list) does not fail the call:
        its result is the exception, for the caller to judge. The breaker hears back from every
        call, whatever it raises (a half-open probe that raised would otherwise keep the tier
        off for good).
        """
        if not self.breaker.allow():
            self.count_error("circuit_open")
            return None
        ok = False
        try:
            result: list[Any] = []
            for lo in range(0, len(commands), self.batch_pages):
                pipe = self.client.pipeline(transaction=False)
                for name, args in commands[lo : lo + self.batch_pages]:
                    getattr(pipe, name)(*args)
                result += pipe.execute(raise_on_error=False)
            ok = True
        except self._errors_caught as exc:
            timeout = "timeout" in type(exc).__name__.lower() or "timed out" in str(exc)
            self.count_error("timeout" if timeout else "unavailable")
            return None
        except Exception:  # a client bug or MemoryError: a miss, never a failed batch
            self.count_error("client")
            return None
        finally:
            if ok:
                self.breaker.success()
            else:
                self.breaker.failure()
        return result

    def _contains_raw(self, page_hashes: Sequence[bytes]) -> list[bool]:
        result = self._call([("exists", (self.key(h),)) for h in page_hashes])
        return (
            [False] * len(page_hashes)
            if result is None
            else [isinstance(r, int) and r > 0 for r in result]
        )

    def _read_raw(self, page_hashes: Sequence[bytes]) -> list[bytes | None]:
        """Each record's bytes, read with a bounded ``GETRANGE``: a value of a size no record
        has is counted as ``size``, deleted, a miss (at most one byte past the largest record
        size crosses the wire). A value that is not a string (a list, a hash, ... under a page
        key) is counted as ``wrong_type``, deleted, a miss. An empty value is a miss."""
        last = max(self.record_sizes)  # GETRANGE's end is inclusive: one byte past a record
        result = self._call([("getrange", (self.key(h), 0, last)) for h in page_hashes])
        if result is None:
            return [None] * len(page_hashes)
        out: list[bytes | None] = []
        bad: list[bytes] = []
        for h, r in zip(page_hashes, result, strict=True):
            if isinstance(r, bytes) and (not r or len(r) in self.record_sizes):
                out.append(r or None)
                continue
            self.count_error("size" if isinstance(r, bytes) else "wrong_type")
            bad.append(h)
            out.append(None)
        if bad:
            self._delete_raw(bad)
        return out

    def _write_raw(self, items: Sequence[tuple[bytes, bytes]]) -> int:
        result = self._call([("set", (self.key(h), data, self.ttl_s)) for h, data in items])
        if result is None:
            return 0
        refused = sum(1 for r in result if isinstance(r, Exception))  # e.g. OOM at maxmemory
        for _ in range(refused):
            self.count_error("refused")
        return sum(len(d) for (_, d), r in zip(items, result, strict=True) if r is True)

    def _delete_raw(self, page_hashes: Sequence[bytes]) -> None:
        self._call([("delete", (self.key(h),)) for h in page_hashes])

    def _on_hits(self, page_hashes: Sequence[bytes]) -> None:
        """Refresh the TTL of pages that were used (LRU-like retention)."""
        self._call([("expire", (self.key(h), self.ttl_s)) for h in page_hashes])

    def _backend_stats(self) -> dict[str, Any]:
        return {"up": self.breaker.is_closed, "breaker_opened": self.breaker.num_opened}

    # ---- documents ---------------------------------------------------------------------
    def get_document(self, name: str) -> bytes | None:
        """The bytes saved under ``name``; None when absent or Redis is unreachable.

        Raises:
            DocumentTooLargeError: the value is larger than ``MAX_DOCUMENT_BYTES`` (at most one
                byte past it was read; counted as ``document_size``).
        """
        key = self.doc_prefix + check_document_name(name)
        result = self._call([("getrange", (key, 0, MAX_DOCUMENT_BYTES))])
        value = None if result is None else result[0]
        if not isinstance(value, bytes):
            return None
        if len(value) > MAX_DOCUMENT_BYTES:
            self.count_error("document_size")
            raise DocumentTooLargeError(name)
        return value or None

    def put_document(self, name: str, data: bytes) -> None:
        """Save ``data`` under ``name`` (with the page TTL).

        Raises:
            OSError: Redis is unreachable (the caller decides whether that matters).
            DocumentTooLargeError: ``data`` is larger than ``MAX_DOCUMENT_BYTES``.
        """
        key = self.doc_prefix + check_document_name(name)
        result = self._call([("set", (key, check_document_size(name, data), self.ttl_s))])
        if result is None or result[0] is not True:
            raise OSError(f"kv_store {self.url}: could not save document {name!r}")

    def replace_document(self, name: str, old: bytes | None, new: bytes) -> None:
        """Save ``new`` under ``name`` only when the saved document is still ``old`` (None:
        absent): ``WATCH`` the key, read it (bounded), then ``MULTI``/``SET``/``EXEC``, which
        Redis refuses when another client wrote the key in between (every server and process
        sharing the Redis sees the same key).

        Raises:
            DocumentConflictError: another writer saved a different document since.
            OSError: Redis is unreachable. DocumentTooLargeError.
        """
        import redis

        key = self.doc_prefix + check_document_name(name)
        check_document_size(name, new)
        if not self.breaker.allow():
            self.count_error("circuit_open")
            raise OSError(f"kv_store {self.url}: unavailable, document {name!r} not saved")
        ok = False
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.watch(key)
                current = pipe.getrange(key, 0, MAX_DOCUMENT_BYTES) or None
                if current != old:
                    ok = True
                    raise DocumentConflictError(name)
                pipe.multi()
                pipe.set(key, new, ex=self.ttl_s)
                try:
                    pipe.execute()
                except redis.WatchError:
                    ok = True
                    raise DocumentConflictError(name) from None
            ok = True
        except self._errors_caught as exc:
            self.count_error("unavailable")
            raise OSError(f"kv_store {self.url}: could not save document {name!r}") from exc
        finally:
            if ok:
                self.breaker.success()
            else:
                self.breaker.failure()

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
