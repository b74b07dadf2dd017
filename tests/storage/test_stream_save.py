"""KVStream.save / load: a restored stream continues bit-identically; damaged files and files
of another configuration are refused by the same checks as the tier's records."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.storage.record import RecordError
from pagedattn.stream.kv_stream import KVStream

CONFIG: dict[str, Any] = dict(
    num_heads=4, num_kv_heads=2, head_dim=8, page_size=4, max_pages=5, sliding_window=9,
    num_sink_tokens=2,
)  # fmt: skip


def _qkv(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = rng.standard_normal((4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 8)).astype(np.float32)
    return q, k, rng.standard_normal((2, 8)).astype(np.float32)


@pytest.mark.parametrize("eviction", ["evict_idle", "reclaim"])
def test_loaded_stream_continues_bit_identically(tmp_path: Path, eviction: str) -> None:
    rng = np.random.default_rng(0)
    a = KVStream(**CONFIG, eviction=eviction)  # type: ignore[arg-type]
    for _ in range(23):
        a.step(*_qkv(rng))
    path = tmp_path / "stream.kv"
    a.save(path)
    b = KVStream(**CONFIG, eviction=eviction)  # type: ignore[arg-type]
    b.load(path)
    assert b.num_tokens == 23 and b.pages_evicted == a.pages_evicted
    assert [r[1:] for r in b.resident_pages()] == [r[1:] for r in a.resident_pages()]
    for (pa, _, _), (pb, _, _) in zip(a.resident_pages(), b.resident_pages(), strict=True):
        assert a.pool.kv[:, :, pa].tobytes() == b.pool.kv[:, :, pb].tobytes()
    for _ in range(10):  # and they go on to compute exactly the same outputs
        q, k, v = _qkv(rng)
        assert a.step(q, k, v).tobytes() == b.step(q, k, v).tobytes()


def test_bad_files_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a = KVStream(**CONFIG)
    for _ in range(11):
        a.step(*_qkv(rng))
    path = tmp_path / "stream.kv"
    a.save(path)
    good = path.read_bytes()

    def refused(data: bytes, kind: str, **config: Any) -> None:
        path.write_bytes(data)
        with pytest.raises(RecordError) as info:
            KVStream(**{**CONFIG, **config}).load(path)
        assert info.value.kind == kind

    refused(good[:-7], "checksum")
    refused(good[:10], "truncated")
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    refused(bytes(flipped), "checksum")
    refused(pickle.dumps({"kv": a.pool.kv}), "bad_magic")
    refused(good, "namespace", sliding_window=13)  # another configuration
    refused(good, "namespace", num_sink_tokens=0)
    with pytest.raises(ValueError, match="fresh stream"):
        path.write_bytes(good)
        a.load(path)
