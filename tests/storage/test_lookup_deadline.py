"""A restore has a deadline: behind a Redis whose every round trip is slow, the requests wait
for their KV beside the steps (no step waits on the store), their restores are given up at the
deadline and counted, and they answer as without a tier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage.redis_store import RedisStore
from tests.engine.helpers import drain, tiny_model, tokens
from tests.redis_server import RedisServer
from tests.storage.slow_proxy import SlowProxy

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(9).integers(3, 250, 37)]
OTHER = [int(t) for t in np.random.default_rng(10).integers(3, 250, 37)]
PS = 4
DEADLINE_S = 0.3
DELAY_S = 2.0  # per round trip: without a deadline a lookup takes >= 2 round trips = 4 s


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[SlowProxy]:
    p = SlowProxy(redis_server.port)
    yield p
    p.stop()


def _engine(model: Any, url: str | None, **options: Any) -> LLMEngine:
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64), **options)
    store = None
    if url is not None:
        probe = LLMEngine(config, model)
        pool = probe.page_pool
        shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
        store = RedisStore(url, probe.namespace, shape, timeout_s=10.0, cooldown_s=0.5)
    return LLMEngine(config, model, kv_store=store)


def test_a_slow_redis_is_a_counted_miss_at_the_deadline(
    redis_server: RedisServer, proxy: SlowProxy
) -> None:
    model = tiny_model()
    scratch = tokens(drain(_engine(model, None), {0: [("r", PROMPT, GREEDY)]})["r"])
    writer = _engine(model, redis_server.url)
    drain(writer, {0: [("r", PROMPT, GREEDY), ("s", OTHER, GREEDY)]})
    writer.close()

    proxy.delay_s = DELAY_S
    reader = _engine(model, proxy.url, kv_store_deadline_s=DEADLINE_S)
    reader.add_request(PROMPT, GREEDY, request_id="r")
    reader.add_request(OTHER, GREEDY, request_id="s")  # both start their restore at once
    outs = reader.step()
    assert reader.get_stats()["num_waiting_for_kv"] == 2 and not outs.report.ran_model
    while reader.has_unfinished_requests():
        outs += reader.step()
    answer = [t for o in outs if o.request_id == "r" for c in o.outputs for t in c.token_ids]
    assert answer == scratch  # recomputed, as without a tier
    assert all(o.error is None for o in outs)
    assert all(o.num_cached_tokens == 0 for o in outs)
    stats = reader.get_stats()["kv_store"]
    assert stats["lookups_timed_out"] == 2 and stats["lookups_skipped"] == 0
    assert stats["lookup_pages_dropped"] == 9 + 9  # every page both restores asked for
    assert stats["errors"]["deadline"] == 2
    assert reader.get_stats()["tier_restored_tokens"] == 0
    proxy.delay_s = 0.0
    reader.close()


def test_a_fast_store_is_unaffected_by_the_deadline(
    redis_server: RedisServer, proxy: SlowProxy
) -> None:
    model = tiny_model()
    writer = _engine(model, redis_server.url)
    scratch = tokens(drain(writer, {0: [("r", PROMPT, GREEDY)]})["r"])
    writer.close()
    reader = _engine(model, proxy.url, kv_store_deadline_s=5.0)
    outs = drain(reader, {0: [("r", PROMPT, GREEDY)]})["r"]
    assert tokens(outs) == scratch and outs[-1].num_cached_tokens == 36
    stats = reader.get_stats()["kv_store"]
    assert stats["lookups_timed_out"] == 0 and "deadline" not in stats["errors"]
    reader.close()


def test_the_deadline_is_validated() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="kv_store_deadline_s"):
            EngineConfig(kv_store_deadline_s=bad)  # type: ignore[arg-type]
