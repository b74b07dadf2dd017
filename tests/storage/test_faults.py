"""Fault tests with a real redis-server under the engine: killed in the middle of a batch of
streamed requests, restarted, paused; and a disk tier holding damaged records. Every request
completes and answers as without a tier; bad records are counted misses, never used."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.cache.hashing import hash_page_tokens, prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage.disk import DiskStore
from pagedattn.storage.redis_store import RedisStore
from tests.engine.helpers import drain, tiny_model, tokens
from tests.redis_server import RedisServer

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
PS = 4
_rng = np.random.default_rng(11)
SHARED = [int(t) for t in _rng.integers(3, 250, 24)]
PROMPTS = [SHARED + [int(t) for t in _rng.integers(3, 250, 5 + i)] for i in range(6)]


def _engine(model: Any, store: Any = None, fingerprint: str = "tiny-0") -> LLMEngine:
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=128))
    return LLMEngine(config, model, model_fingerprint=fingerprint, kv_store=store)


def _redis(server: RedisServer, model: Any) -> RedisStore:
    engine = _engine(model)  # only for the namespace and page shape
    pool = engine.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    return RedisStore(server.url, engine.namespace, shape, timeout_s=0.2, cooldown_s=0.3)


def _answers(engine: LLMEngine, kill_at: int | None = None, server: Any = None) -> list[list[int]]:
    """Stream the prompts in (one new request per step); ``server.kill()`` before step
    ``kill_at``. Returns each request's tokens; asserts none failed."""
    outs: dict[str, list[Any]] = {}
    step = 0
    pending = [(f"r{i}", p) for i, p in enumerate(PROMPTS)]
    while pending or engine.has_unfinished_requests():
        if pending:
            rid, prompt = pending.pop(0)
            engine.add_request(prompt, GREEDY, request_id=rid)
        if step == kill_at:
            server.kill()
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        step += 1
    assert all(o[-1].finished and o[-1].error is None for o in outs.values())
    return [tokens(outs[f"r{i}"]) for i in range(len(PROMPTS))]


def test_redis_killed_mid_batch_then_restarted(redis_server: RedisServer) -> None:
    model = tiny_model()
    expected = _answers(_engine(model))
    warm = _engine(model, _redis(redis_server, model))
    assert _answers(warm) == expected  # fills the tier
    assert warm.kv_tier is not None
    warm.kv_tier.flush()
    engine = _engine(model, _redis(redis_server, model))
    assert _answers(engine, kill_at=3, server=redis_server) == expected
    stats = engine.get_stats()
    assert stats["tier_restored_tokens"] > 0  # the first requests were served from Redis
    assert stats["kv_store"]["up"] is False and stats["kv_store"]["errors"]

    redis_server.start()  # empty: no persistence
    time.sleep(0.35)  # past the breaker's cool-down
    new_prompt = [int(t) for t in np.random.default_rng(12).integers(3, 250, 21)]
    engine.add_request(new_prompt, GREEDY, request_id="after")
    drain(engine)
    engine.kv_tier.flush()  # type: ignore[union-attr]
    assert engine.get_stats()["kv_store"]["up"] is True
    fresh = _engine(model, _redis(redis_server, model))
    out = drain(fresh, {0: [("again", new_prompt, GREEDY)]})["again"]
    assert out[-1].num_cached_tokens == 20  # hits resumed: written after the restart, restored


def test_redis_paused_requests_complete(redis_server: RedisServer) -> None:
    model = tiny_model()
    expected = _answers(_engine(model))
    warm = _engine(model, _redis(redis_server, model))
    _answers(warm)
    warm.kv_tier.flush()  # type: ignore[union-attr]
    redis_server.pause()
    try:
        engine = _engine(model, _redis(redis_server, model))
        t0 = time.monotonic()
        assert _answers(engine) == expected
        elapsed = time.monotonic() - t0
    finally:
        redis_server.resume()
    errors = engine.get_stats()["kv_store"]["errors"]
    assert errors.get("timeout", 0) >= 1
    # each blocked call costs one 0.2 s timeout and then the breaker answers at once: a
    # liveness bound, far above the run's own time, not a speed assertion
    assert elapsed < 30


def test_damaged_disk_records_under_the_engine(tmp_path: Path) -> None:
    model = tiny_model()
    expected = _answers(_engine(model))
    namespace = _engine(model).namespace
    pool = _engine(model).page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    warm = _engine(model, DiskStore(tmp_path, namespace, shape))
    _answers(warm)
    warm.close()
    first_page = DiskStore(tmp_path, namespace, shape).path_of(
        prefix_page_hashes(SHARED, PS, namespace)[0]
    )
    good = first_page.read_bytes()
    marker = tmp_path / "executed"
    other_ns = _engine(tiny_model(seed=4), None, "tiny-4").namespace
    damaged = {
        "truncated": good[:100],
        "checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "bad_magic": pickle.dumps(_Evil(marker)),
        "namespace": other_record(other_ns, shape),
    }
    for kind, data in damaged.items():
        first_page.write_bytes(data)  # every prompt starts with this page
        reader = _engine(model, DiskStore(tmp_path, namespace, shape))
        assert _answers(reader) == expected
        reader.close()
        refused = "size" if kind in ("truncated", "bad_magic") else kind  # refused unread
        assert reader.get_stats()["kv_store"]["errors"] == {refused: 1}
        assert first_page.read_bytes() == good  # deleted, then written again whole
        assert not marker.exists()  # the pickle was never loaded


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def other_record(namespace: bytes, shape: tuple[int, ...]) -> bytes:
    """A valid record of another model's namespace."""
    from pagedattn.cache.hashing import PageKey
    from pagedattn.storage.record import encode_record

    key = PageKey(hash_page_tokens(None, [1, 2, 3, 4], namespace), None, (1, 2, 3, 4))
    return encode_record(namespace, key, np.zeros(shape, np.float32))
