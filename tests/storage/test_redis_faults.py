"""Redis faults that are not the network: a page key holding another Redis type is a bad record
(counted, deleted, a miss; the tier stays up), and the circuit breaker's half-open probe hears
back whatever the call raises."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage.redis_store import RedisStore
from tests.engine.helpers import drain, tiny_model, tokens
from tests.redis_server import RedisServer
from tests.storage.pages import PAGE_SHAPE, all_equal, namespace, pages

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(5).integers(3, 250, 37)]
PS = 4


def _engine(model: Any, store: RedisStore | None) -> LLMEngine:
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64))
    return LLMEngine(config, model, model_fingerprint="tiny-0", kv_store=store)


def _store(server: RedisServer, engine: LLMEngine) -> RedisStore:
    pool = engine.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    return RedisStore(server.url, engine.namespace, shape, timeout_s=1.0, cooldown_s=0.3)


def _run(engine: LLMEngine) -> tuple[list[int], int]:
    outs = drain(engine, {0: [("r", PROMPT, GREEDY)]})["r"]
    return tokens(outs), outs[-1].num_cached_tokens


@pytest.mark.parametrize("kind", ["list", "hash", "set"])
def test_a_page_key_of_another_type_is_a_bad_record(redis_server: RedisServer, kind: str) -> None:
    model = tiny_model()
    scratch, _ = _run(_engine(model, None))
    writer = _engine(model, _store(redis_server, _engine(model, None)))
    assert _run(writer) == (scratch, 0)
    writer.close()
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    hashes = prefix_page_hashes(PROMPT, PS, writer.namespace)
    reader_store = _store(redis_server, writer)
    key = reader_store.key(hashes[3])
    client.delete(key)
    {"list": lambda: client.rpush(key, b"x"), "hash": lambda: client.hset(key, "f", b"x"),
     "set": lambda: client.sadd(key, b"x")}[kind]()  # fmt: skip

    reader = _engine(model, reader_store)
    assert _run(reader) == (scratch, 12)  # pages 0-2 restored, page 3 on is recomputed
    stats = reader.get_stats()["kv_store"]
    assert stats["errors"] == {"wrong_type": 1}
    assert stats["up"] is True and stats["breaker_opened"] == 0
    reader.close()  # the write-through lands: page 3 is rewritten as a record
    assert client.type(key) == b"string"

    again = _engine(model, _store(redis_server, writer))  # repaired: every page restores
    assert _run(again) == (scratch, 36)
    assert again.get_stats()["kv_store"]["errors"] == {}
    again.close()


class _FailingPipeline:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def get(self, *args: Any) -> None: ...

    def getrange(self, *args: Any) -> None: ...

    def execute(self, **kwargs: Any) -> list[Any]:
        raise self.exc


@pytest.mark.parametrize("exc", [MemoryError(), KeyboardInterrupt()])
def test_a_probe_that_raises_does_not_keep_the_breaker_open(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    clock = [0.0]
    store = RedisStore(redis_server.url, namespace(), PAGE_SHAPE, timeout_s=1.0, cooldown_s=1.0)
    store.breaker._clock = lambda: clock[0]
    written = pages(list(range(100, 116)), store.namespace)
    store.put(written)
    keys = [p.key for p in written]
    real = store.client.pipeline
    monkeypatch.setattr(store.client, "pipeline", lambda **kw: _FailingPipeline(ConnectionError()))
    assert store.get(keys) == [None] * 4  # the breaker opens
    assert store.stats()["up"] is False
    clock[0] += 2.0  # past the cool-down: the next call is the half-open probe, and it raises
    monkeypatch.setattr(store.client, "pipeline", lambda **kw: _FailingPipeline(exc))
    if isinstance(exc, Exception):
        assert store.get(keys) == [None] * 4  # a miss, counted
        assert store.stats()["errors"]["client"] == 1
    else:
        with pytest.raises(type(exc)):
            store.get(keys)
    monkeypatch.setattr(store.client, "pipeline", real)
    clock[0] += 2.0  # another cool-down: a new probe goes out and closes the breaker
    assert all_equal(store.get(keys), written)
    assert store.stats()["up"] is True
    store.close()
