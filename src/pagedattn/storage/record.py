"""The page record: one full KV page as bytes, checked field by field before any use.

Layout (all integers little-endian; one format for the disk and the Redis tier and for
``KVStream.save``), in the spirit of llama.cpp's session files (magic + version + the state
that must match) and LMCache's chunk keys (model + format + prefix hash):

====================  ======================================================================
field                 bytes
====================  ======================================================================
magic                 8, ``b"PAGEDKV\\0"``
format_version        u16, :data:`FORMAT_VERSION`
flags                 u16, bit 0 = has a parent page, bit 1 = signed
header_size           u32, :data:`HEADER.size` (a sanity check)
namespace             16, the cache namespace (:func:`pagedattn.cache.hashing.cache_namespace`)
page_hash             16, the page's chained prefix hash
parent_hash           16, the previous page's hash (zeros for a first page)
dtype                 8, NumPy dtype string (``b"<f4"``), zero padded
ndim, shape           u8 + 6 x u64 (unused dims 0)
num_tokens            u32, token ids that follow
payload_nbytes        u64
token_ids             num_tokens x i64
payload               the raw C-order array bytes
checksum              16, xxh3_128 of every byte above
signature             32, only when signed: HMAC-SHA256 of every byte above under the
                      store's shared key
====================  ======================================================================

The checksum is integrity (a torn or flipped byte), not authentication: anyone who can write
to the store can write a record that checks out. With a shared key
(:func:`signing_key`) every record is signed and a reader refuses an unsigned or wrongly
signed one (``signature``), so only holders of the key can place KV in the tier.

Nothing is ever unpickled or evaluated: a record is parsed with :mod:`struct` and
``np.frombuffer`` only, after its checksum matched. Every way a record can be wrong raises
:class:`RecordError` with a ``kind`` (see :data:`ERROR_KINDS`), which the stores count.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from pagedattn.cache.hashing import HASH_NBYTES, PageKey, hash_page_tokens

MAGIC = b"PAGEDKV\x00"
FORMAT_VERSION = 1
MAX_DIMS = 6
HEADER = struct.Struct("<8sHHI16s16s16s8sB6QIQ")
CHECKSUM_NBYTES = 16
SIGNATURE_NBYTES = 32
#: Fewest bytes a shared signing key may have.
MIN_KEY_NBYTES = 16
_HAS_PARENT = 1
_SIGNED = 2
#: Why a record was refused; stores count misses by these kinds.
ERROR_KINDS = (
    "truncated",
    "bad_magic",
    "version",
    "checksum",
    "namespace",
    "hash",
    "parent",
    "tokens",
    "shape",
    "signature",
    "size",
)


class RecordError(ValueError):
    """A record that must not be used. ``kind`` is one of :data:`ERROR_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def signing_key(key: str | bytes | None) -> bytes | None:
    """The shared key as bytes (a str is UTF-8), None for none.

    Raises:
        ValueError: a key shorter than :data:`MIN_KEY_NBYTES` bytes.
    """
    if key is None:
        return None
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < MIN_KEY_NBYTES:
        raise ValueError(
            f"kv_store_key: expected at least {MIN_KEY_NBYTES} bytes, got {len(raw)} "
            "(use a long random secret, e.g. `openssl rand -hex 32`)"
        )
    return raw


def record_nbytes(
    page_shape: tuple[int, ...], dtype: np.dtype | type, num_tokens: int, *, signed: bool
) -> int:
    """The exact size of a record of one page (known before reading it)."""
    payload = int(np.prod(page_shape)) * np.dtype(dtype).itemsize
    tail = CHECKSUM_NBYTES + (SIGNATURE_NBYTES if signed else 0)
    return HEADER.size + 8 * num_tokens + payload + tail


def _signature(key: bytes, signed_part: bytes | memoryview) -> bytes:
    return hmac.new(key, signed_part, hashlib.sha256).digest()


@dataclass(frozen=True)
class DecodedRecord:
    """A record that passed every check. ``kv`` is read-only, shaped as written."""

    key: PageKey
    namespace: bytes
    kv: np.ndarray


def encode_record(
    namespace: bytes, key: PageKey, kv: np.ndarray, *, sign_with: bytes | None = None
) -> bytes:
    """Serialize one page.

    Args:
        namespace: 16-byte cache namespace.
        key: the page's hashes and token ids.
        kv: the page's KV, e.g. float32 ``(num_layers, 2, num_kv_heads, page_size, head_dim)``;
            written C-order.
        sign_with: the shared key (:func:`signing_key`): the record is signed; None: unsigned.

    Returns:
        The record bytes (header + token ids + payload + checksum).

    Raises:
        ValueError: a hash or namespace that is not 16 bytes, more than 6 dims.
    """
    for name, value in (("namespace", namespace), ("page_hash", key.page_hash)):
        if len(value) != HASH_NBYTES:
            raise ValueError(f"{name}: expected {HASH_NBYTES} bytes, got {len(value)}")
    if key.parent_hash is not None and len(key.parent_hash) != HASH_NBYTES:
        raise ValueError(f"parent_hash: expected {HASH_NBYTES} bytes, got {len(key.parent_hash)}")
    if kv.ndim > MAX_DIMS:
        raise ValueError(f"kv: expected at most {MAX_DIMS} dims, got shape {kv.shape}")
    arr = np.ascontiguousarray(kv)
    dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    arr = arr.astype(dtype, copy=False)
    payload = arr.tobytes()
    tokens = np.asarray(key.token_ids, dtype="<i8").tobytes()
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        (_HAS_PARENT if key.parent_hash is not None else 0) | (_SIGNED if sign_with else 0),
        HEADER.size,
        namespace,
        key.page_hash,
        key.parent_hash or b"\x00" * HASH_NBYTES,
        dtype.str.encode("ascii"),
        arr.ndim,
        *arr.shape,
        *([0] * (MAX_DIMS - arr.ndim)),
        len(key.token_ids),
        len(payload),
    )
    body = header + tokens + payload
    record = body + xxhash.xxh3_128_digest(body)
    return record + _signature(sign_with, record) if sign_with else record


def decode_record(
    data: bytes | memoryview,
    *,
    namespace: bytes,
    expected: PageKey | None = None,
    dtype: np.dtype | type | None = None,
    shape: tuple[int, ...] | None = None,
    verify_with: bytes | None = None,
) -> DecodedRecord:
    """Parse and check a record; nothing in it is trusted before the checks pass.

    Checks, in order: magic (``bad_magic``, e.g. a pickle), length (``truncated``),
    format version (``version``), total size (``truncated``), checksum (``checksum``), with
    ``verify_with`` the signature (``signature``: unsigned or signed with another key),
    namespace (``namespace``: another model or config), that the token ids re-hash with the
    parent to the page hash (``hash``), then against ``expected``: hash (``hash``), parent
    (``parent``), token ids (``tokens``); dtype and shape (``shape``).

    Args:
        data: the record bytes.
        namespace: the reader's 16-byte namespace.
        expected: the page the reader asked for (None: accept any page of the namespace).
        dtype, shape: the payload the reader needs (None: accept what the header says).
        verify_with: the shared key: only records it signed are accepted. None: signed and
            unsigned records are both accepted (the reader trusts whoever writes the store).

    Returns:
        The decoded record; ``kv`` is a read-only view of ``data``.

    Raises:
        RecordError: any failed check (``kind`` says which).
    """
    buf = memoryview(data).cast("B")
    if bytes(buf[: len(MAGIC)]) != MAGIC:
        raise RecordError("bad_magic", f"starts with {bytes(buf[:8])!r}, not a page record")
    if len(buf) < HEADER.size + CHECKSUM_NBYTES:
        raise RecordError("truncated", f"{len(buf)} bytes, shorter than a header")
    fields = HEADER.unpack_from(buf, 0)
    magic, version, flags, header_size, ns, page_hash, parent_hash, dt = fields[:8]
    ndim, dims, num_tokens, payload_nbytes = fields[8], fields[9:15], fields[15], fields[16]
    del magic  # checked above
    if version != FORMAT_VERSION or header_size != HEADER.size:
        raise RecordError("version", f"format {version}, this reader reads {FORMAT_VERSION}")
    signed = bool(flags & _SIGNED)
    end = HEADER.size + 8 * num_tokens + payload_nbytes
    size = end + CHECKSUM_NBYTES + (SIGNATURE_NBYTES if signed else 0)
    if len(buf) != size:
        raise RecordError("truncated", f"{len(buf)} bytes, the header says {size}")
    if xxhash.xxh3_128_digest(buf[:end]) != bytes(buf[end : end + CHECKSUM_NBYTES]):
        raise RecordError("checksum", "checksum mismatch (corrupted bytes)")
    if verify_with is not None:
        if not signed:
            raise RecordError("signature", "an unsigned record; this store needs signed ones")
        tag = _signature(verify_with, buf[: end + CHECKSUM_NBYTES])
        if not hmac.compare_digest(tag, bytes(buf[end + CHECKSUM_NBYTES :])):
            raise RecordError("signature", "signed with another key (or forged)")
    if ns != namespace:
        raise RecordError("namespace", "written under another model/config namespace")
    tokens = tuple(int(t) for t in np.frombuffer(buf, "<i8", num_tokens, HEADER.size))
    parent = parent_hash if flags & _HAS_PARENT else None
    if hash_page_tokens(parent, np.asarray(tokens, np.int64), namespace) != page_hash:
        raise RecordError("hash", "token ids and parent do not hash to the page hash")
    key = PageKey(page_hash, parent, tokens)
    if expected is not None:
        if expected.page_hash != page_hash:
            raise RecordError("hash", "a different page than the one asked for")
        if expected.parent_hash != parent:
            raise RecordError("parent", "the parent hash differs from the one asked for")
        if tuple(expected.token_ids) != tokens:
            raise RecordError("tokens", "the token ids differ from the ones asked for")
    try:
        record_dtype = np.dtype(bytes(dt).rstrip(b"\x00").decode("ascii"))
    except (TypeError, UnicodeDecodeError) as exc:
        raise RecordError("shape", f"unknown dtype {bytes(dt)!r}") from exc
    if record_dtype.hasobject or record_dtype.kind not in "fiu":
        raise RecordError("shape", f"dtype {record_dtype} is not a numeric array dtype")
    record_shape = tuple(int(d) for d in dims[:ndim])
    if ndim > MAX_DIMS or int(np.prod(record_shape)) * record_dtype.itemsize != payload_nbytes:
        raise RecordError("shape", f"shape {record_shape} does not match {payload_nbytes} bytes")
    if (dtype is not None and record_dtype != np.dtype(dtype)) or (
        shape is not None and record_shape != tuple(shape)
    ):
        raise RecordError("shape", f"{record_dtype}{record_shape}, expected {dtype}{shape}")
    offset = HEADER.size + 8 * num_tokens
    kv = np.frombuffer(buf, record_dtype, int(np.prod(record_shape)), offset).reshape(record_shape)
    return DecodedRecord(key, bytes(ns), kv)
