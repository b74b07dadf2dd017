"""The page record: round trip, and every kind of wrong record refused with its kind."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pagedattn.storage.record import HEADER, RecordError, decode_record, encode_record
from tests.storage.pages import PAGE_SHAPE, namespace, pages


def test_round_trip_is_bit_identical() -> None:
    ns = namespace()
    page = pages(list(range(8)), ns)[1]
    data = encode_record(ns, page.key, page.kv)
    rec = decode_record(data, namespace=ns, expected=page.key, dtype=np.float32, shape=PAGE_SHAPE)
    assert rec.key == page.key
    assert rec.kv.tobytes() == page.kv.tobytes()
    # the size is what the layout says: header + 8 bytes per token + payload + checksum
    assert len(data) == HEADER.size + 8 * 4 + page.kv.nbytes + 16


def _refused(data: bytes, kind: str, **kwargs: object) -> None:
    ns = kwargs.pop("ns", namespace())
    with pytest.raises(RecordError) as info:
        decode_record(data, namespace=ns, **kwargs)  # type: ignore[arg-type]
    assert info.value.kind == kind


def test_every_wrong_record_is_refused_by_kind() -> None:
    ns = namespace()
    first, second = pages(list(range(8)), ns)
    data = encode_record(ns, second.key, second.kv)
    _refused(data[:-1], "truncated")
    _refused(data[:20], "truncated")
    _refused(data + b"\x00", "truncated")
    flipped = bytearray(data)
    flipped[HEADER.size + 40] ^= 0x01  # one bit of the payload
    _refused(bytes(flipped), "checksum")
    _refused(pickle.dumps({"kv": second.kv}), "bad_magic")
    version = bytearray(data)
    version[8] = 99
    _refused(bytes(version), "version")
    _refused(data, "namespace", ns=namespace("model-b"))
    _refused(data, "hash", expected=first.key)
    other_parent = type(second.key)(second.key.page_hash, None, second.key.token_ids)
    _refused(data, "parent", expected=other_parent)
    other_tokens = type(second.key)(second.key.page_hash, second.key.parent_hash, (9, 9, 9, 9))
    _refused(data, "tokens", expected=other_tokens)
    _refused(data, "shape", shape=(2, 2, 2, 4, 4))
    _refused(data, "shape", dtype=np.float16)


def test_a_forged_key_with_a_valid_checksum_is_refused() -> None:
    """Token ids that do not hash to the page hash (a forged or buggy writer) never pass."""
    ns = namespace()
    page = pages(list(range(4)), ns)[0]
    forged = type(page.key)(page.key.page_hash, None, (7, 7, 7, 7))
    _refused(encode_record(ns, forged, page.kv), "hash")


def test_object_dtype_is_refused() -> None:
    ns = namespace()
    page = pages(list(range(4)), ns)[0]
    data = bytearray(encode_record(ns, page.key, page.kv))
    # rewrite the dtype field to "|O8" and fix the checksum: still refused
    import xxhash

    offset = 8 + 2 + 2 + 4 + 16 * 3
    data[offset : offset + 8] = b"|O8".ljust(8, b"\x00")
    body = bytes(data[:-16])
    _refused(body + xxhash.xxh3_128_digest(body), "shape")
