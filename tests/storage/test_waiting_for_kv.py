"""A restore from the persistent tier is a request state ("waiting for KV"), never a wait in a
step: while a store holds a restore's read, the running streams go on decoding one token per
step; once the records are in, the request answers as a cold run with the restored prefix as
its cached tokens (on a model with sliding-window layers, both layer groups' pages). Its
deadline turns a held read into a counted miss (same text), and an abort while it waits leaks
no page and no thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.cache.hashing import PageKey
from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig
from pagedattn.engine.kv_restores import MAX_IN_FLIGHT
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage import KVStore, StoredPage
from pagedattn.storage.disk import DiskStore
from pagedattn.storage.redis_store import RedisStore
from tests.engine.helpers import assert_all_pages_free, drain, tiny_model, tokens
from tests.redis_server import RedisServer

PS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
STREAM = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
_rng = np.random.default_rng(21)
PROMPT = [int(t) for t in _rng.integers(3, 250, 37)]  # 9 full pages before the last token
OTHER = [int(t) for t in _rng.integers(3, 250, 37)]
# no full page before their last token: nothing to restore, both run from their first step
STREAMS = {rid: [int(t) for t in _rng.integers(3, 250, n)] for rid, n in (("a", 3), ("b", 4))}
MODEL = tiny_model(seed=4)
HELD_S = 60.0  # a held read waits at most this long (a test that fails must not hang)


class HeldStore:
    """A store whose page reads wait until ``release`` is set (a stalled network)."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.namespace = store.namespace
        self.release = threading.Event()
        self.entered = threading.Event()  # a read is waiting on ``release``
        self.returned = threading.Event()  # a held read returned

    def contains(self, page_hashes: Sequence[bytes]) -> list[bool]:
        return self.store.contains(page_hashes)

    def get(self, keys: Sequence[PageKey]) -> list[np.ndarray | None]:
        self.entered.set()
        self.release.wait(HELD_S)
        try:
            return self.store.get(keys)
        finally:
            self.returned.set()

    def put(self, pages: Sequence[StoredPage]) -> int:
        return self.store.put(pages)

    def get_document(self, name: str) -> bytes | None:
        return self.store.get_document(name)

    def put_document(self, name: str, data: bytes) -> None:
        self.store.put_document(name, data)

    def replace_document(self, name: str, old: bytes | None, new: bytes) -> None:
        self.store.replace_document(name, old, new)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def close(self) -> None:
        self.release.set()
        self.store.close()


def _config(**options: Any) -> EngineConfig:
    return EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64), **options)


def _page_shape(engine: LLMEngine) -> tuple[int, ...]:
    pool = engine.page_pool
    return (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)


def _stored(tmp_path: Path) -> tuple[bytes, tuple[int, ...]]:
    """Fill a disk store with PROMPT's and OTHER's pages; its namespace and page shape."""
    writer = LLMEngine(_config(kv_store=str(tmp_path)), MODEL)
    drain(writer, {0: [("r", PROMPT, GREEDY), ("o", OTHER, GREEDY)]})
    writer.close()
    return writer.namespace, _page_shape(writer)


def _held_reader(tmp_path: Path, deadline_s: float = HELD_S) -> tuple[LLMEngine, HeldStore]:
    namespace, shape = _stored(tmp_path)
    store = HeldStore(DiskStore(tmp_path, namespace, shape))
    return LLMEngine(_config(kv_store_deadline_s=deadline_s), MODEL, kv_store=store), store


def _cold(prompt: list[int], params: SamplingParams = GREEDY, model: Any = MODEL) -> list[int]:
    return tokens(drain(LLMEngine(_config(), model), {0: [("c", prompt, params)]})["c"])


def _by_request(outs: Sequence[RequestOutput]) -> dict[str, list[RequestOutput]]:
    got: dict[str, list[RequestOutput]] = {}
    for out in outs:
        got.setdefault(out.request_id, []).append(out)
    return got


def _start_streams(engine: LLMEngine) -> list[RequestOutput]:
    """Run the streams' prompts and sample their first tokens (one step)."""
    for rid, prompt in STREAMS.items():
        engine.add_request(prompt, STREAM, request_id=rid)
    outs = engine.step()
    assert sorted(_by_request(outs)) == ["a", "b"]
    return list(outs)


def _decode_while_waiting(
    engine: LLMEngine, held: threading.Event | None, steps: int
) -> list[RequestOutput]:
    """Start the restore of PROMPT; while its read is held on the store (``held``: set once
    the read is there), the streams get one token each per step and the restoring request
    nothing."""
    outs: list[RequestOutput] = []
    engine.add_request(PROMPT, GREEDY, request_id="r")
    outs += engine.step()  # its restore starts; the streams decode
    assert held is None or held.wait(HELD_S), "the restore never read the store"
    for _ in range(steps):
        step = engine.step()
        got = _by_request(step)
        assert sorted(got) == ["a", "b"], "only the running streams produced output"
        assert all(len(tokens(got[rid])) == 1 for rid in got)
        assert step.report.num_seqs == 2 and step.report.num_tier_restored_tokens == 0
        assert engine.get_stats()["num_waiting_for_kv"] == 1
        outs += step
    return outs


def test_streams_decode_while_a_restore_waits_on_the_store(tmp_path: Path) -> None:
    engine, store = _held_reader(tmp_path)
    try:
        outs = _start_streams(engine)
        outs += _decode_while_waiting(engine, store.entered, steps=8)
        assert engine.get_stats()["tier_restored_tokens"] == 0
    finally:
        store.release.set()
    restored = 0
    while engine.has_unfinished_requests():
        step = engine.step()
        restored += step.report.num_tier_restored_tokens
        outs += step
    got = _by_request(outs)
    assert tokens(got["r"]) == _cold(PROMPT)
    assert got["r"][-1].num_cached_tokens == 36  # the 9 restored pages
    assert restored == 36 == engine.get_stats()["tier_restored_tokens"]
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == _cold(prompt, STREAM), rid
    assert engine.get_stats()["kv_store"]["errors"] == {}
    assert_all_pages_free(engine)
    engine.close()


def test_the_deadline_turns_a_held_read_into_a_counted_miss(tmp_path: Path) -> None:
    engine, _ = _held_reader(tmp_path, deadline_s=0.05)
    outs = drain(engine, {0: [("r", PROMPT, GREEDY)]})["r"]
    assert tokens(outs) == _cold(PROMPT) and outs[-1].num_cached_tokens == 0
    stats = engine.get_stats()
    assert stats["tier_restored_tokens"] == 0 and stats["num_waiting_for_kv"] == 0
    tier = stats["kv_store"]
    assert tier["lookups_timed_out"] == 1 and tier["lookup_pages_dropped"] == 9
    assert tier["errors"]["deadline"] == 1
    # The read given up is still held on the store: the next restore is a miss at once.
    first = engine.add_request(OTHER, GREEDY, request_id="o")
    step = engine.step()
    assert step.report.num_seqs == 1 and engine.get_stats()["num_waiting_for_kv"] == 0
    rest = drain(engine)
    assert tokens([*step, *rest.get(first, [])]) == _cold(OTHER)
    tier = engine.get_stats()["kv_store"]
    assert tier["lookups_skipped"] == 1 and tier["lookup_pages_dropped"] == 9 + 9
    assert tier["errors"]["deadline"] == 2
    assert_all_pages_free(engine)
    engine.close()


def test_an_abort_while_waiting_for_kv_leaks_nothing(tmp_path: Path) -> None:
    engine, store = _held_reader(tmp_path)
    free = engine.cache_manager.allocator.num_free_pages
    engine.add_request(PROMPT, GREEDY, request_id="r")
    assert not engine.step().report.ran_model  # it waits for its KV
    assert store.entered.wait(HELD_S)
    assert engine.get_stats()["num_waiting_for_kv"] == 1
    assert engine.abort("r")
    (final,) = engine.step()
    assert final.request_id == "r" and final.finished
    assert final.outputs[0].finish_reason == "abort" and not final.outputs[0].token_ids
    assert not engine.has_unfinished_requests()
    store.release.set()  # the abandoned read returns on the restore thread; nothing uses it
    assert store.returned.wait(HELD_S)
    engine.step()
    stats = engine.get_stats()
    assert stats["num_waiting_for_kv"] == 0 and stats["tier_restored_tokens"] == 0
    assert stats["kv_store"]["pages_restored"] == 0
    assert engine.cache_manager.allocator.num_free_pages == free
    assert_all_pages_free(engine)
    restores = engine.kv_restores
    assert restores is not None
    engine.close()
    give_up = time.monotonic() + HELD_S
    while any(t.name.startswith(restores.thread_name) for t in threading.enumerate()):
        assert time.monotonic() < give_up, "the restore thread outlived close()"
        time.sleep(0.01)


def test_a_paused_redis_holds_only_the_restoring_request(redis_server: RedisServer) -> None:
    probe = LLMEngine(_config(), MODEL)
    namespace, shape = probe.namespace, _page_shape(probe)

    def redis() -> RedisStore:
        return RedisStore(redis_server.url, namespace, shape, timeout_s=HELD_S)

    writer = LLMEngine(_config(), MODEL, kv_store=redis())
    drain(writer, {0: [("r", PROMPT, GREEDY)]})
    writer.close()
    engine = LLMEngine(_config(kv_store_deadline_s=HELD_S), MODEL, kv_store=redis())
    outs = _start_streams(engine)
    redis_server.pause()  # SIGSTOP: the restore's first request is never answered
    try:
        outs += _decode_while_waiting(engine, None, steps=6)
    finally:
        redis_server.resume()
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = _by_request(outs)
    assert tokens(got["r"]) == _cold(PROMPT) and got["r"][-1].num_cached_tokens == 36
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == _cold(prompt, STREAM), rid
    assert_all_pages_free(engine)
    engine.close()


def test_a_hybrid_model_restores_both_groups_while_streams_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer 0 slides over 8 tokens, layer 1 sees everything: two layer groups, each with its
    own records. The sliding group's read (after the full group's: it needs the hit point)
    is held; the streams decode meanwhile."""
    model = tiny_model(seed=4, layer_windows=(8, 0))
    writer = LLMEngine(_config(kv_store=str(tmp_path)), model)
    drain(writer, {0: [("r", PROMPT, GREEDY)]})
    writer.close()
    engine = LLMEngine(_config(kv_store=str(tmp_path), kv_store_deadline_s=HELD_S), model)
    assert len(engine.kv_tiers) == 2
    sliding = engine.kv_tiers[1]
    entered, release, real_fetch = threading.Event(), threading.Event(), sliding.fetch

    def held_fetch(job: Any) -> None:
        entered.set()
        release.wait(HELD_S)
        real_fetch(job)

    monkeypatch.setattr(sliding, "fetch", held_fetch)
    try:
        outs = _start_streams(engine)
        outs += _decode_while_waiting(engine, entered, steps=6)
    finally:
        release.set()
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = _by_request(outs)
    assert tokens(got["r"]) == _cold(PROMPT, model=model)
    assert got["r"][-1].num_cached_tokens == 36
    # the full group's 9 pages; the sliding group's pages a query at position 36 sees
    # (positions 29-36: pages 7 and 8)
    assert [t.stats()["pages_restored"] for t in engine.kv_tiers] == [9, 2]
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == _cold(prompt, STREAM, model), rid
    assert_all_pages_free(engine)
    engine.close()


def test_reads_in_flight_are_bounded_and_the_next_request_waits_its_turn(tmp_path: Path) -> None:
    """With the store held, MAX_IN_FLIGHT restores wait for their KV; the next request stays
    first in the waiting queue (its turn comes, it is no miss), and every one is restored."""
    prompts = {f"p{i}": [int(t) for t in _rng.integers(3, 250, 13)] for i in range(5)}
    writer = LLMEngine(_config(kv_store=str(tmp_path)), MODEL)
    drain(writer, {0: [(rid, p, GREEDY) for rid, p in prompts.items()]})
    writer.close()
    store = HeldStore(DiskStore(tmp_path, writer.namespace, _page_shape(writer)))
    engine = LLMEngine(_config(kv_store_deadline_s=HELD_S), MODEL, kv_store=store)
    try:
        for rid, prompt in prompts.items():
            engine.add_request(prompt, GREEDY, request_id=rid)
        for _ in range(3):
            assert not engine.step().report.ran_model
            stats = engine.get_stats()
            assert stats["num_waiting_for_kv"] == MAX_IN_FLIGHT == 4
            assert stats["num_waiting"] == 5  # the fifth waits in the queue
        assert store.entered.wait(HELD_S)
    finally:
        store.release.set()
    got = drain(engine)
    for rid, prompt in prompts.items():
        assert tokens(got[rid]) == _cold(prompt), rid
        assert got[rid][-1].num_cached_tokens == 12, rid  # 3 full pages before the last token
    stats = engine.get_stats()
    assert stats["tier_restored_tokens"] == 5 * 12
    assert stats["kv_store"]["errors"] == {} and stats["kv_store"]["lookups_skipped"] == 0
    assert_all_pages_free(engine)
    engine.close()


def test_the_read_overlaps_the_wait_for_a_seat(tmp_path: Path) -> None:
    """Both seats (``max_num_seqs=2``) are taken by the streams: the third request's restore
    starts anyway, and it is admitted with its restored prefix once a stream ends."""
    namespace, shape = _stored(tmp_path)
    store = DiskStore(tmp_path, namespace, shape)
    two = SchedulerConfig(max_num_seqs=2)
    engine = LLMEngine(_config(scheduler=two, kv_store_deadline_s=HELD_S), MODEL, kv_store=store)
    outs = _start_streams(engine)
    engine.add_request(PROMPT, GREEDY, request_id="r")
    step = engine.step()
    assert sorted(_by_request(step)) == ["a", "b"]
    assert engine.get_stats()["num_waiting_for_kv"] == 1  # no seat, yet its read runs
    outs += step
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = _by_request(outs)
    assert tokens(got["r"]) == _cold(PROMPT) and got["r"][-1].num_cached_tokens == 36
    assert_all_pages_free(engine)
    engine.close()
