"""How many restores wait and on what: at most four reads in flight (the next request keeps its
turn), a read that overlaps the wait for a seat, a burst of one prompt reading its records once,
and an abort that leaves a shared read to the request still waiting on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pagedattn.config import SchedulerConfig
from pagedattn.engine.kv_restores import MAX_IN_FLIGHT
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.storage.disk import DiskStore
from tests.engine.helpers import assert_all_pages_free, drain, tokens
from tests.storage.held_store import (
    GREEDY,
    HELD_S,
    MODEL,
    PROMPT,
    HeldStore,
    by_request,
    cold,
    config,
    held_reader,
    page_shape,
    start_streams,
    stored,
)


def test_reads_in_flight_are_bounded_and_the_next_request_waits_its_turn(tmp_path: Path) -> None:
    """With the store held, MAX_IN_FLIGHT restores wait for their KV; the next request stays
    first in the waiting queue (its turn comes, it is no miss), and every one is restored."""
    rng = np.random.default_rng(5)
    prompts = {f"p{i}": [int(t) for t in rng.integers(3, 250, 13)] for i in range(5)}
    writer = LLMEngine(config(kv_store=str(tmp_path)), MODEL)
    drain(writer, {0: [(rid, p, GREEDY) for rid, p in prompts.items()]})
    writer.close()
    store = HeldStore(DiskStore(tmp_path, writer.namespace, page_shape(writer)))
    engine = LLMEngine(config(kv_store_deadline_s=HELD_S), MODEL, kv_store=store)
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
        assert tokens(got[rid]) == cold(prompt), rid
        assert got[rid][-1].num_cached_tokens == 12, rid  # 3 full pages before the last token
    stats = engine.get_stats()
    assert stats["tier_restored_tokens"] == 5 * 12
    assert stats["kv_store"]["errors"] == {} and stats["kv_store"]["lookups_skipped"] == 0
    assert_all_pages_free(engine)
    engine.close()


def test_the_read_overlaps_the_wait_for_a_seat(tmp_path: Path) -> None:
    """Both seats (``max_num_seqs=2``) are taken by the streams: the third request's restore
    starts anyway, and it is admitted with its restored prefix once a stream ends."""
    namespace, shape = stored(tmp_path)
    store = DiskStore(tmp_path, namespace, shape)
    two = SchedulerConfig(max_num_seqs=2)
    engine = LLMEngine(config(scheduler=two, kv_store_deadline_s=HELD_S), MODEL, kv_store=store)
    outs = start_streams(engine)
    engine.add_request(PROMPT, GREEDY, request_id="r")
    step = engine.step()
    assert sorted(by_request(step)) == ["a", "b"]
    assert engine.get_stats()["num_waiting_for_kv"] == 1  # no seat, yet its read runs
    outs += step
    while engine.has_unfinished_requests():
        outs += engine.step()
    got = by_request(outs)
    assert tokens(got["r"]) == cold(PROMPT) and got["r"][-1].num_cached_tokens == 36
    assert_all_pages_free(engine)
    engine.close()


def test_a_burst_sharing_a_prefix_reads_it_once(tmp_path: Path) -> None:
    """Three requests of one prompt arrive together: the second and third wait on the first's
    read; the first's restore fills the pool, the others hit it there."""
    engine, store = held_reader(tmp_path)
    try:
        for rid in ("r0", "r1", "r2"):
            engine.add_request(PROMPT, GREEDY, request_id=rid)
        assert not engine.step().report.ran_model
        assert engine.get_stats()["num_waiting_for_kv"] == 3
        assert store.entered.wait(HELD_S)
    finally:
        store.release.set()
    got = drain(engine)
    for rid in ("r0", "r1", "r2"):
        assert tokens(got[rid]) == cold(PROMPT) and got[rid][-1].num_cached_tokens == 36, rid
    stats = engine.get_stats()
    assert stats["tier_restored_tokens"] == 36  # restored once
    assert stats["kv_store"]["pages_hit"] == 9  # each record read once
    assert stats["kv_store"]["pages_restored"] == 9
    assert_all_pages_free(engine)
    engine.close()


def test_an_abort_leaves_a_shared_read_to_the_request_still_waiting(tmp_path: Path) -> None:
    engine, store = held_reader(tmp_path)
    try:
        engine.add_request(PROMPT, GREEDY, request_id="gone")
        engine.add_request(PROMPT, GREEDY, request_id="kept")
        engine.step()
        assert store.entered.wait(HELD_S)
        assert engine.abort("gone")
        assert engine.get_stats()["num_waiting_for_kv"] == 1
    finally:
        store.release.set()
    got = drain(engine)
    assert got["gone"][-1].outputs[0].finish_reason == "abort"
    assert tokens(got["kept"]) == cold(PROMPT) and got["kept"][-1].num_cached_tokens == 36
    assert engine.get_stats()["tier_restored_tokens"] == 36
    assert_all_pages_free(engine)
    engine.close()
