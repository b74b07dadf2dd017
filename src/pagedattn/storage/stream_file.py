"""The single-stream state file of ``KVStream.save`` / ``KVStream.load``: page records (the
format of :mod:`pagedattn.storage.record`, checked the same way) in one file.

Layout: magic ``b"PAGEDKVS"``, u16 format version, u64 tokens written, u32 record count, then
per record a u64 length and the record bytes, then an xxh3_128 checksum of everything before.
Written atomically (tmp + fsync + rename, as the disk tier). A reader knows the most bytes a
file of its stream can have (its page capacity times a record's size) and refuses a larger
file from its metadata, before reading it.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from pagedattn.cache.hashing import PageKey
from pagedattn.storage.record import (
    FORMAT_VERSION,
    DecodedRecord,
    RecordError,
    decode_record,
    encode_record,
    record_nbytes,
)

STREAM_MAGIC = b"PAGEDKVS"
_HEAD = struct.Struct("<8sHQI")
_LEN = struct.Struct("<Q")


def write_stream_file(
    path: str | Path, namespace: bytes, num_tokens: int, pages: Sequence[tuple[PageKey, np.ndarray]]
) -> None:
    """Write a stream file atomically.

    Args:
        path: destination file.
        namespace: the stream's 16-byte namespace.
        num_tokens: tokens the stream has written.
        pages: (key, kv) of every resident page, position order.

    Raises:
        OSError: the write failed (nothing is left at ``path``'s temporary name).
    """
    from pagedattn.storage.disk import atomic_write

    parts = [_HEAD.pack(STREAM_MAGIC, FORMAT_VERSION, num_tokens, len(pages))]
    for key, kv in pages:
        record = encode_record(namespace, key, kv)
        parts += [_LEN.pack(len(record)), record]
    body = b"".join(parts)
    atomic_write(Path(path), body + xxhash.xxh3_128_digest(body))


def max_stream_file_bytes(max_pages: int, shape: tuple[int, ...], dtype: np.dtype | type) -> int:
    """The largest stream file of a stream holding at most ``max_pages`` pages of ``shape``."""
    page_size = shape[3] if len(shape) == 5 else 0
    record = record_nbytes(shape, dtype, page_size, signed=False)
    return _HEAD.size + max_pages * (_LEN.size + record) + 16


def read_stream_file(
    path: str | Path,
    namespace: bytes,
    shape: tuple[int, ...],
    dtype: np.dtype | type,
    max_pages: int,
) -> tuple[int, list[DecodedRecord]]:
    """Read and check a stream file: its size first (at most :func:`max_stream_file_bytes`,
    from the file's metadata, before reading), then container magic, version, checksum and
    lengths, then each record with every check of :func:`decode_record` (namespace, hash
    chain, dtype, shape).

    Returns:
        (tokens written, the records in file order).

    Raises:
        RecordError: any failed check (``kind`` says which). OSError: unreadable file.
    """
    limit = max_stream_file_bytes(max_pages, shape, dtype)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO never blocks
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or size > limit:
            raise RecordError(
                "size", f"{path}: {size} bytes, more than a stream of {max_pages} pages saves"
            )
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RecordError("size", f"{path}: more than {limit} bytes")
    if data[: len(STREAM_MAGIC)] != STREAM_MAGIC:
        raise RecordError("bad_magic", f"{path}: not a pagedattn stream file")
    if len(data) < _HEAD.size + 16:
        raise RecordError("truncated", f"{path}: {len(data)} bytes")
    _, version, num_tokens, count = _HEAD.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise RecordError("version", f"{path}: format {version}, expected {FORMAT_VERSION}")
    if xxhash.xxh3_128_digest(data[:-16]) != data[-16:]:
        raise RecordError("checksum", f"{path}: checksum mismatch (truncated or corrupted)")
    records, offset, end = [], _HEAD.size, len(data) - 16
    for _ in range(count):
        if offset + _LEN.size > end:
            raise RecordError("truncated", f"{path}: fewer records than the header says")
        (n,) = _LEN.unpack_from(data, offset)
        offset += _LEN.size
        if offset + n > end:
            raise RecordError("truncated", f"{path}: a record runs past the end")
        records.append(
            decode_record(data[offset : offset + n], namespace=namespace, dtype=dtype, shape=shape)
        )
        offset += n
    if offset != end:
        raise RecordError("truncated", f"{path}: {end - offset} bytes after the last record")
    return int(num_tokens), records
