"""DiskStore: one file per page under a directory, safe to share between processes.

- Atomic writes: a temporary file in the target folder, ``fsync``, ``os.replace``, then an
  ``fsync`` of the folder (the POSIX recipe; a reader sees a whole record or none). A failed
  write removes its temporary file; stale ones left by a killed process are removed at open.
- Size cap with LRU eviction that survives restarts: recency is the file's mtime, touched on
  every hit; when the directory grows past ``max_bytes`` the least recently used records go
  until it is under 90 % of the cap.
- Two processes: records are immutable once renamed into place and named by their hash, so
  concurrent writers of one page write identical bytes; a record that vanishes under a reader
  (evicted by the other process) is a miss.

Layout: ``ROOT/kv/<namespace hex>/<hash[:2]>/<hash>.page`` and ``ROOT/documents/<name>.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pagedattn.storage.base import BaseStore, check_document_name
from pagedattn.storage.documents import (
    MAX_DOCUMENT_BYTES,
    DocumentConflictError,
    DocumentTooLargeError,
    check_document_size,
)

_SUFFIX = ".page"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 600.0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (tmp file in the same folder, fsync, rename).

    Raises:
        OSError: the write failed (no temporary file is left behind).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


class DiskStore(BaseStore):
    """Pages as files under ``root`` (see the module doc).

    Args:
        root: the store directory (created if missing).
        namespace: 16-byte cache namespace.
        page_shape: KV shape of one page; dtype: KV dtype.
        max_bytes: cap on the bytes of every page record under ``root`` (all namespaces);
            None = no cap.
        key: the shared signing key (see :class:`~pagedattn.storage.base.BaseStore`).

    Raises:
        ValueError: ``max_bytes`` < 1, a short key. OSError: ``root`` cannot be created.
    """

    backend = "disk"

    def __init__(
        self,
        root: str | os.PathLike[str],
        namespace: bytes,
        page_shape: tuple[int, ...],
        dtype: np.dtype | type = np.float32,
        *,
        max_bytes: int | None = None,
        key: str | bytes | None = None,
    ) -> None:
        super().__init__(namespace, page_shape, dtype, key=key)
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes: expected None or >= 1, got {max_bytes}")
        self.root = Path(root).expanduser()
        self.kv_root = self.root / "kv"
        self.dir = self.kv_root / namespace.hex()
        self.documents = self.root / "documents"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.num_evicted = 0
        self._bytes = 0
        now = time.time()
        for entry in self._scan(include_tmp=True):
            if entry.name.startswith(_TMP_PREFIX):
                if now - entry.stat().st_mtime > _STALE_TMP_S:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self._bytes += entry.stat().st_size

    def path_of(self, page_hash: bytes) -> Path:
        """The file of a page hash."""
        h = page_hash.hex()
        return self.dir / h[:2] / f"{h}{_SUFFIX}"

    # ---- backend hooks -----------------------------------------------------------------
    def _contains_raw(self, page_hashes: Sequence[bytes]) -> list[bool]:
        return [self.path_of(h).is_file() for h in page_hashes]

    def _read_raw(self, page_hashes: Sequence[bytes]) -> list[bytes | None]:
        """Each record's bytes; a file that is not a regular file of a record's size (known
        from the page shape) is refused from its metadata, unread: counted (``size``),
        deleted, a miss."""
        out: list[bytes | None] = []
        bad: list[bytes] = []
        for h in page_hashes:
            try:
                data = self._read_record(self.path_of(h))
            except FileNotFoundError:  # never written, or evicted by another process
                data = None
            except OSError:
                self.count_error("io")
                data = None
            if data is False:
                self.count_error("size")
                bad.append(h)
                data = None
            out.append(data)
        if bad:
            self._delete_raw(bad)
        return out

    def _read_record(self, path: Path) -> bytes | Literal[False]:
        """The file's bytes, or False when its size (or kind) rules it out as a record."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO never blocks
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size not in self.record_sizes:
                return False
            chunks, left = [], st.st_size
            while left:
                chunk = os.read(fd, left)
                if not chunk:  # shrank under us: not a whole record
                    return False
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _write_raw(self, items: Sequence[tuple[bytes, bytes]]) -> int:
        written = 0
        for page_hash, data in items:
            path = self.path_of(page_hash)
            if path.exists():  # same hash + namespace: the same page (checked on read)
                self._touch(path)
                continue
            try:
                atomic_write(path, data)
            except OSError:
                self.count_error("io")
                continue
            written += len(data)
        with self._lock:
            self._bytes += written
            over = self.max_bytes is not None and self._bytes > self.max_bytes
        if over:
            self._evict()
        return written

    def _delete_raw(self, page_hashes: Sequence[bytes]) -> None:
        for h in page_hashes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path_of(h))

    def _on_hits(self, page_hashes: Sequence[bytes]) -> None:
        for h in page_hashes:
            self._touch(self.path_of(h))

    def _backend_stats(self) -> dict[str, Any]:
        with self._lock:
            return {"bytes_stored": self._bytes, "pages_evicted": self.num_evicted}

    # ---- documents ---------------------------------------------------------------------
    def get_document(self, name: str) -> bytes | None:
        """The bytes saved under ``name``, None when there are none.

        Raises:
            DocumentTooLargeError: the file is larger than ``MAX_DOCUMENT_BYTES`` (or not a regular
                file); it was not read (counted as ``document_size``).
        """
        path = self._document_path(name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_DOCUMENT_BYTES:
                self.count_error("document_size")
                raise DocumentTooLargeError(name, st.st_size)
            data = os.read(fd, MAX_DOCUMENT_BYTES + 1)
            while len(data) < st.st_size:
                chunk = os.read(fd, MAX_DOCUMENT_BYTES + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if len(data) > MAX_DOCUMENT_BYTES:  # grew under us
            self.count_error("document_size")
            raise DocumentTooLargeError(name)
        return data

    def put_document(self, name: str, data: bytes) -> None:
        """Save ``data`` under ``name`` atomically (replacing any previous one).

        Raises:
            DocumentTooLargeError: ``data`` is larger than ``MAX_DOCUMENT_BYTES``.
        """
        atomic_write(self._document_path(name), check_document_size(name, data))

    def replace_document(self, name: str, old: bytes | None, new: bytes) -> None:
        """Save ``new`` under ``name`` only when the saved document is still ``old`` (None:
        absent), under an exclusive lock on the document's lock file (every process sharing
        the folder takes it).

        Raises:
            DocumentConflictError: another writer saved a different document since.
            DocumentTooLargeError: ``new`` is too large.
        """
        path = self._document_path(name)
        check_document_size(name, new)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.get_document(name) != old:
                raise DocumentConflictError(name)
            atomic_write(path, new)

    def _document_path(self, name: str) -> Path:
        return self.documents / f"{check_document_name(name)}.json"

    # ---- internals ---------------------------------------------------------------------
    @staticmethod
    def _touch(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)

    def _scan(self, include_tmp: bool = False) -> Iterator[os.DirEntry[str]]:
        """Every record (and temporary file) under ``root/kv``, all namespaces."""
        if not self.kv_root.is_dir():
            return
        for ns in os.scandir(self.kv_root):
            if not ns.is_dir():
                continue
            for sub in os.scandir(ns.path):
                if not sub.is_dir():
                    continue
                for entry in os.scandir(sub.path):
                    is_tmp = entry.name.startswith(_TMP_PREFIX)
                    if entry.name.endswith(_SUFFIX) or (include_tmp and is_tmp):
                        yield entry

    def _evict(self) -> None:
        """Delete least recently used records (oldest mtime) until under 90 % of the cap."""
        assert self.max_bytes is not None
        files: list[tuple[float, int, str]] = []
        for entry in self._scan():
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat()
                files.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        target = int(self.max_bytes * 0.9)
        evicted = 0
        for _, size, path in sorted(files):
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                evicted += 1
            total -= size
        with self._lock:
            self._bytes = total
            self.num_evicted += evicted
