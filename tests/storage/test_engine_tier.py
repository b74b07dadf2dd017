"""The tier in the engine: pages written after their forward, restored on a prefix-cache miss
by a fresh engine (another process would do the same), greedy answers token-identical to a
from-scratch run, restored KV bit-identical to what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage import PageKey, StoredPage
from pagedattn.storage.disk import DiskStore
from tests.engine.helpers import drain, tiny_model, tokens

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(3).integers(3, 250, 37)]
PS = 4


def _engine(
    model: Any, kv_store: str | None, fingerprint: str = "tiny-0", **cache: Any
) -> LLMEngine:
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64, **cache), kv_store=kv_store)
    return LLMEngine(config, model, model_fingerprint=fingerprint)


def _run(engine: LLMEngine, prompt: list[int], rid: str = "r") -> tuple[list[int], int]:
    outs = drain(engine, {0: [(rid, prompt, GREEDY)]})[rid]
    return tokens(outs), outs[-1].num_cached_tokens


def _page_kv(engine: LLMEngine, page_hash: bytes) -> bytes:
    page_id = engine.cache_manager.allocator.page_of(page_hash)
    return bytes(engine.page_pool.kv[:, :, page_id].tobytes())


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16", "int8"])
def test_fresh_engine_restores_pages_written_by_another(
    tmp_path: Path, kv_cache_dtype: str
) -> None:
    model = tiny_model()
    scratch, cached = _run(_engine(model, None, kv_cache_dtype=kv_cache_dtype), PROMPT)
    assert cached == 0
    writer = _engine(model, str(tmp_path), kv_cache_dtype=kv_cache_dtype)
    assert writer.page_pool.kv.dtype == np.dtype(kv_cache_dtype)
    assert _run(writer, PROMPT) == (scratch, 0)
    writer.kv_tier.flush()  # type: ignore[union-attr]
    stats = writer.get_stats()["kv_store"]
    # 37 prompt + 5 fed-back generated tokens = 42 computed: 10 full pages written
    assert stats["pages_written"] == 10 and stats["writes_dropped"] == 0
    hashes = prefix_page_hashes(PROMPT, PS, writer.namespace)
    written = [_page_kv(writer, h) for h in hashes]

    reader = _engine(model, str(tmp_path), kv_cache_dtype=kv_cache_dtype)  # a restart
    answer, cached = _run(reader, PROMPT)
    assert answer == scratch  # token-identical to the from-scratch answer
    assert cached == 36  # 9 full pages (the last prompt token is always computed)
    assert reader.get_stats()["tier_restored_tokens"] == 36
    assert [_page_kv(reader, h) for h in hashes] == written  # bit-identical KV
    assert reader.get_stats()["kv_store"]["errors"] == {}
    reader.cache_manager.check_integrity()


def test_memory_hits_then_tier_for_the_rest(tmp_path: Path) -> None:
    model = tiny_model()
    writer = _engine(model, str(tmp_path))
    scratch, _ = _run(writer, PROMPT)
    writer.close()
    reader = _engine(model, str(tmp_path))
    _run(reader, PROMPT[:13], "short")  # pages 0-2 now in memory (and restored from the tier)
    restored = reader.get_stats()["tier_restored_tokens"]
    assert restored == 12
    answer, cached = _run(reader, PROMPT, "long")
    assert answer == scratch and cached == 36
    assert reader.get_stats()["tier_restored_tokens"] == restored + 24  # only pages 3-8


def test_another_model_or_config_never_restores(tmp_path: Path) -> None:
    writer = _engine(tiny_model(), str(tmp_path))
    _run(writer, PROMPT)
    writer.close()
    other_model = tiny_model(seed=5)
    scratch, _ = _run(_engine(other_model, None, "tiny-5"), PROMPT)
    reader = _engine(other_model, str(tmp_path), "tiny-5")
    assert _run(reader, PROMPT) == (scratch, 0)
    windowed = _engine(tiny_model(), str(tmp_path), sliding_window=16)
    assert _run(windowed, PROMPT)[1] == 0
    half = _engine(tiny_model(), str(tmp_path), kv_cache_dtype="float16")
    assert _run(half, PROMPT)[1] == 0  # float32 pages never enter a float16 pool


def test_an_int8_engine_stores_codes_and_scales_and_refuses_a_float16_record(
    tmp_path: Path,
) -> None:
    """An int8 page persists as it lies in the pool (head_dim + 4 int8 per row: codes, then a
    float32 scale), never re-expanded; a float16 record under the int8 engine's own keys (a
    writer of another dtype, or a tampered store) is refused, unread, by its size (what an
    int8 page's dtype and shape make it)."""
    model = tiny_model()
    writer = _engine(model, str(tmp_path), kv_cache_dtype="int8")
    scratch, _ = _run(writer, PROMPT)
    writer.kv_tier.flush()  # type: ignore[union-attr]
    pool = writer.page_pool
    page_shape = (pool.num_layers, 2, pool.num_kv_heads, PS, pool.head_dim + 4)
    hashes = prefix_page_hashes(PROMPT, PS, writer.namespace)
    keys = [
        PageKey(h, hashes[i - 1] if i else None, tuple(PROMPT[i * PS : (i + 1) * PS]))
        for i, h in enumerate(hashes)
    ]
    stored = DiskStore(tmp_path, writer.namespace, page_shape, np.int8).get(keys)
    assert all(kv is not None and kv.dtype == np.int8 and kv.shape == page_shape for kv in stored)
    assert [kv.tobytes() for kv in stored if kv is not None] == [
        _page_kv(writer, h) for h in hashes
    ]
    writer.close()

    other = tmp_path / "other"
    half_shape = (*page_shape[:4], pool.head_dim)
    forged = DiskStore(other, writer.namespace, half_shape, np.float16)
    rng = np.random.default_rng(0)
    forged.put([StoredPage(k, rng.standard_normal(half_shape).astype(np.float16)) for k in keys])
    reader = _engine(model, str(other), kv_cache_dtype="int8")
    assert _run(reader, PROMPT) == (scratch, 0)  # nothing restored: computed from scratch
    assert reader.get_stats()["kv_store"]["errors"].get("size", 0) >= 1


def test_kv_store_needs_prefix_caching(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_store: needs prefix caching"):
        _engine(tiny_model(), str(tmp_path), enable_prefix_caching=False)
    with pytest.raises(ValueError, match=r"EngineConfig\.kv_store"):
        EngineConfig(kv_store="")
