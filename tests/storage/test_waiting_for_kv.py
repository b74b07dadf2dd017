"""A restore from the persistent tier is a request state ("waiting for KV"), never a wait in a
step: while a store holds a restore's read, the running streams go on decoding one token per
step; once the records are in, the request answers as a cold run with the restored prefix as
its cached tokens (on a model with sliding-window layers, both layer groups' pages). Its
deadline turns a held read into a counted miss (same text), and an abort while it waits leaks
no page and no thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.storage.redis_store import RedisStore
from tests.engine.helpers import assert_all_pages_free, drain, tiny_model, tokens
from tests.redis_server import RedisServer
from tests.storage.held_store import (
    GREEDY,
    HELD_S,
    MODEL,
    OTHER,
    PROMPT,
    STREAM,
    STREAMS,
    by_request,
    cold,
    config,
    decode_while_waiting,
    held_reader,
    page_shape,
    start_streams,
)


def test_streams_decode_while_a_restore_waits_on_the_store(tmp_path: Path) -> None:
    engine, store = held_reader(tmp_path)
    try:
        outs = start_streams(engine)
        outs += decode_while_waiting(engine, store.entered, steps=8)
        assert engine.get_stats()["tier_restored_tokens"] == 0
    finally:
        store.release.set()
    restored = 0
    while engine.has_unfinished_requests():
        step = engine.step()
        restored += step.report.num_tier_restored_tokens
        outs += step
    got = by_request(outs)
    assert tokens(got["r"]) == cold(PROMPT)
    assert got["r"][-1].num_cached_tokens == 36  # the 9 restored pages
    assert restored == 36 == engine.get_stats()["tier_restored_tokens"]
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == cold(prompt, STREAM), rid
    assert engine.get_stats()["kv_store"]["errors"] == {}
    assert_all_pages_free(engine)
    engine.close()


def test_the_deadline_turns_a_held_read_into_a_counted_miss(tmp_path: Path) -> None:
    engine, _ = held_reader(tmp_path, deadline_s=0.05)
    outs = drain(engine, {0: [("r", PROMPT, GREEDY)]})["r"]
    assert tokens(outs) == cold(PROMPT) and outs[-1].num_cached_tokens == 0
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
    assert tokens([*step, *rest.get(first, [])]) == cold(OTHER)
    tier = engine.get_stats()["kv_store"]
    assert tier["lookups_skipped"] == 1 and tier["lookup_pages_dropped"] == 9 + 9
    assert tier["errors"]["deadline"] == 2
    assert_all_pages_free(engine)
    engine.close()


def test_an_abort_while_waiting_for_kv_leaks_nothing(tmp_path: Path) -> None:
    engine, store = held_reader(tmp_path)
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
    probe = LLMEngine(config(), MODEL)
    namespace, shape = probe.namespace, page_shape(probe)

    def redis() -> RedisStore:
        return RedisStore(redis_server.url, namespace, shape, timeout_s=HELD_S)

    writer = LLMEngine(config(), MODEL, kv_store=redis())
    drain(writer, {0: [("r", PROMPT, GREEDY)]})
    writer.close()
    engine = LLMEngine(config(kv_store_deadline_s=HELD_S), MODEL, kv_store=redis())
    outs = start_streams(engine)
    redis_server.pause()  # SIGSTOP: the restore's first request is never answered
    try:
        outs += decode_while_waiting(engine, None, steps=6)
    finally:
        redis_server.resume()
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = by_request(outs)
    assert tokens(got["r"]) == cold(PROMPT) and got["r"][-1].num_cached_tokens == 36
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == cold(prompt, STREAM), rid
    assert_all_pages_free(engine)
    engine.close()


def test_a_hybrid_model_restores_both_groups_while_streams_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer 0 slides over 8 tokens, layer 1 sees everything: two layer groups, each with its
    own records. The sliding group's read (after the full group's: it needs the hit point)
    is held; the streams decode meanwhile."""
    model = tiny_model(seed=4, layer_windows=(8, 0))
    writer = LLMEngine(config(kv_store=str(tmp_path)), model)
    drain(writer, {0: [("r", PROMPT, GREEDY)]})
    writer.close()
    engine = LLMEngine(config(kv_store=str(tmp_path), kv_store_deadline_s=HELD_S), model)
    assert len(engine.kv_tiers) == 2
    sliding = engine.kv_tiers[1]
    entered, release, real_fetch = threading.Event(), threading.Event(), sliding.fetch

    def held_fetch(job: Any) -> None:
        entered.set()
        release.wait(HELD_S)
        real_fetch(job)

    monkeypatch.setattr(sliding, "fetch", held_fetch)
    try:
        outs = start_streams(engine)
        outs += decode_while_waiting(engine, entered, steps=6)
    finally:
        release.set()
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = by_request(outs)
    assert tokens(got["r"]) == cold(PROMPT, model=model)
    assert got["r"][-1].num_cached_tokens == 36
    # the full group's 9 pages; the sliding group's pages a query at position 36 sees
    # (positions 29-36: pages 7 and 8)
    assert [t.stats()["pages_restored"] for t in engine.kv_tiers] == [9, 2]
    for rid, prompt in STREAMS.items():
        assert tokens(got[rid]) == cold(prompt, STREAM, model), rid
    assert_all_pages_free(engine)
    engine.close()
