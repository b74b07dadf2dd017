"""GET /v1/kv/state: page states worked out by hand, the same counters as /metrics (and so as
the Grafana dashboard), a bounded answer over a pool of thousands of pages in use, shared
snapshots, and a bounded wait on a busy or dead engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.cache import CacheManager
from pagedattn.cache.pool_snapshot import PAGE_STATES, pool_snapshot
from pagedattn.server.errors import APIError
from pagedattn.server.kv_history import CounterHistory
from pagedattn.server.kv_state import SnapshotReader, build_state
from pagedattn.server.kv_state_models import KVState
from tests.server.conftest import ServerFactory

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pagedattn-dashboard.json"


def state(url: str, headers: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/kv/state", params=params, headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    KVState.model_validate(body)
    return body


def expand(cells: list[list[Any]]) -> str:
    return "".join(letter * run for letter, run in cells)


def test_idle_pool_after_a_request_holds_its_full_pages_as_cached_prefixes(
    make_server: ServerFactory,
) -> None:
    with make_server(num_pages=64, page_size=4) as srv:
        empty = state(srv.url)
        group = empty["groups"][0]  # the start-up warm-up leaves no page cached
        assert group["counts"] == {"free": 64, "cached": 0, "used": 0, "shared": 0}
        assert (group["page_size"], group["num_pages"], group["pages_per_cell"]) == (4, 64, 1)
        assert group["kv_dtype"] == "float32" and group["num_layers"] == 2
        # bytes of one page: layers x (K, V) x kv heads x page size x head dim x 4 bytes
        config = json.loads((srv.model_dir / "config.json").read_text())  # type: ignore[operator]
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config["num_key_value_heads"]
        assert group["bytes_per_page"] == 2 * 2 * kv_heads * 4 * head_dim * 4
        assert expand(group["cells"]) == "f" * 64

        prompt = list(range(5, 18))  # 13 tokens
        body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        srv.wait_idle()
        after = state(srv.url)
        # KV was computed for 13 + 6 - 1 = 18 tokens: 4 full pages stay cached, the rest free
        cached = (13 + 6 - 1) // 4
        group = after["groups"][0]
        assert group["counts"] == {"free": 64 - cached, "cached": cached, "used": 0, "shared": 0}
        assert group["num_registered"] == cached
        assert sorted(expand(group["cells"])) == sorted("c" * cached + "f" * (64 - cached))
        assert after["requests"] == [] and after["requests_truncated"] == 0
        counters = after["counters"]
        assert (counters["prefix_cache_queries"], counters["prefix_cache_hits"]) == (13, 0)
        assert counters["prefix_cache_hit_ratio"] == 0.0

        # the same prompt again hits its 3 full prompt pages (12 of 13 tokens)
        httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).raise_for_status()
        srv.wait_idle()
        counters = state(srv.url)["counters"]
        assert (counters["prefix_cache_queries"], counters["prefix_cache_hits"]) == (26, 12)
        assert counters["prefix_cache_hit_ratio"] == pytest.approx(12 / 26)


#: /v1/kv/state counter -> the /metrics sample the Grafana dashboard plots it from
SAME_COUNTERS = {
    "num_running": "pagedattn:num_requests_running",
    "num_waiting": "pagedattn:num_requests_waiting",
    "num_pages": "pagedattn:num_pages",
    "num_used_pages": "pagedattn:num_used_pages",
    "num_free_pages": "pagedattn:num_free_pages",
    "kv_cache_usage": "pagedattn:kv_cache_usage_perc",
    "prefix_cache_queries": "pagedattn:prefix_cache_queries_total",
    "prefix_cache_hits": "pagedattn:prefix_cache_hits_total",
    "num_preemptions": "pagedattn:num_preemptions_total",
}


def test_the_dashboard_and_the_state_route_agree_on_the_counters(
    make_server: ServerFactory,
) -> None:
    exprs = " ".join(
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]
    )
    for metric in [*SAME_COUNTERS.values(), "pagedattn:page_evictions_total"]:
        if metric != "pagedattn:num_pages":  # the pool size is a constant, not plotted
            assert metric in exprs, metric
    # a pool too small for every request at once: preemptions and LRU reuse of cached pages
    with make_server(num_pages=24, page_size=4, max_num_seqs=8) as srv:

        def run(i: int) -> None:
            prompt = [(i * 7 + k) % 200 + 5 for k in range(20)]
            body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 40, "ignore_eos": True}
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120).raise_for_status()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = srv.wait_idle()
        counters = state(srv.url)["counters"]
    assert counters["num_preemptions"] > 0 and counters["evictions"]["lru"] > 0
    for key, metric in SAME_COUNTERS.items():
        assert counters[key] == pytest.approx(metrics[metric]), key
    for reason, count in counters["evictions"].items():
        assert count == metrics[f'pagedattn:page_evictions_total{{reason="{reason}"}}'], reason


def _majority(codes: list[int]) -> str:
    """The cell rule written out: the most common state, ties to the higher code."""
    counts = Counter(codes)
    best = max(counts, key=lambda code: (counts[code], code))
    return "fcus"[best]


def test_thousands_of_pages_in_use_give_a_bounded_answer() -> None:
    num_pages, page_size = 50_000, 4
    m = CacheManager(num_pages, page_size, b"bounded")
    prefix = list(range(1000, 1040))  # 10 full pages every sequence shares
    seq_ids = []
    for s in range(300):
        tokens = prefix + [s * 1000 + k for k in range(560)]  # 150 pages each
        m.add_sequence(s, tokens)
        cached = m.num_tokens(s)
        m.append_slots(s, tokens[cached:])
        m.commit_written(s)
        seq_ids.append(s)
    snap = pool_snapshot(m, seq_ids, max_table=1024)
    engine_snapshot = {
        "pool": snap,
        "sequences": [(f"req-{s}", s, 40 if s else 0) for s in seq_ids],
        "num_running": len(seq_ids),
        "kv_dtype": "float32",
        "num_layers": 2,
        "bytes_per_page": 1024,
        "stats": {
            "num_running": 300, "num_waiting": 0, "num_pages": num_pages,
            "num_free_pages": m.num_free_pages, "kv_cache_usage": 0.9,
            "prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0,
            "evictions": m.evictions,
        },
    }  # fmt: skip
    out = build_state(
        engine_snapshot, time.time(), "m", CounterHistory(dict),
        max_cells=4096, max_requests=64, max_pages_per_request=100,
    )  # fmt: skip
    body = out.model_dump_json()
    assert len(body) < 200_000
    group = out.groups[0]
    used = 300 * 140  # each sequence's own pages; the 10 prefix pages are shared by all
    assert group.counts.model_dump() == {
        "free": num_pages - used - 10, "cached": 0, "used": used, "shared": 10,
    }  # fmt: skip
    per_cell = math.ceil(num_pages / 4096)
    assert (group.pages_per_cell, group.num_cells) == (per_cell, math.ceil(num_pages / per_cell))
    cells = expand([list(c) for c in group.cells])
    assert len(cells) == group.num_cells <= 4096
    codes = list(snap.page_states)
    for k in (0, 1, group.num_cells // 2, group.num_cells - 1):
        assert cells[k] == _majority(codes[k * per_cell : (k + 1) * per_cell]), k
    assert len(out.requests) == 64 and out.requests_truncated == 300 - 64
    for row in out.requests:
        table = row.tables[0]
        assert (table.num_pages, len(table.pages), table.truncated) == (150, 100, 50)
        assert table.states == "s" * 10 + "u" * 90
        assert table.pages == m.page_table(row.seq_id)[:100]
    assert PAGE_STATES == ("free", "cached", "used", "shared")


def test_limits_are_validated_by_name(make_server: ServerFactory) -> None:
    with make_server() as srv:
        for param, value in [("max_cells", 0), ("max_requests", 257), ("max_cells", "x")]:
            r = httpx.get(f"{srv.url}/v1/kv/state", params={param: value})
            assert r.status_code == 400, (param, r.text)
            assert param in json.dumps(r.json()["error"])
        body = state(srv.url, max_cells=1, max_requests=0, max_pages_per_request=0)
        group = body["groups"][0]
        assert (group["num_cells"], group["pages_per_cell"], group["cells"]) == (1, 256, [["f", 1]])


def test_concurrent_callers_share_snapshots(make_server: ServerFactory) -> None:
    with make_server() as srv:
        engine = srv.app.state.async_engine.engine
        taken = []
        original = engine.kv_snapshot

        def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
            taken.append(time.monotonic())
            return original(*args, **kwargs)

        engine.kv_snapshot = counted

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                replies = await asyncio.gather(
                    *(client.get(f"{srv.url}/v1/kv/state") for _ in range(40))
                )
            return [r.status_code for r in replies]

        began = time.monotonic()
        statuses = asyncio.run(burst())
        elapsed = time.monotonic() - began
    assert statuses == [200] * 40
    # one snapshot per 0.25 s at most, however many pages poll
    assert 1 <= len(taken) <= 1 + elapsed / 0.25


def test_each_caller_sees_a_snapshot_asked_for_after_it_arrived() -> None:
    class Counting:
        def __init__(self) -> None:
            self.asked: list[float] = []

        def kv_snapshot(self) -> concurrent.futures.Future[dict[str, Any]]:
            self.asked.append(time.monotonic())
            future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
            future.set_result({"n": len(self.asked)})
            return future

    client = Counting()
    reader = SnapshotReader(client, min_interval_s=0.1)

    async def scenario() -> list[int]:
        first = (await reader.read())[1]["n"]
        second = (await reader.read())[1]["n"]  # arrived after the first: a new one
        burst = await asyncio.gather(*(reader.read() for _ in range(10)))
        return [first, second, *(snap["n"] for _, snap in burst)]

    assert asyncio.run(scenario()) == [1, 2] + [3] * 10  # the burst shares one
    gaps = [b - a for a, b in itertools.pairwise(client.asked)]
    assert len(gaps) == 2 and min(gaps) >= 0.1  # at most one per min_interval_s


def test_a_busy_or_dead_engine_answers_503_in_bounded_time() -> None:
    class NeverAnswers:
        def __init__(self) -> None:
            self.futures: list[concurrent.futures.Future[dict[str, Any]]] = []

        def kv_snapshot(self) -> concurrent.futures.Future[dict[str, Any]]:
            self.futures.append(concurrent.futures.Future())
            return self.futures[-1]

    client = NeverAnswers()
    reader = SnapshotReader(client, timeout_s=0.2)
    with pytest.raises(APIError) as busy:
        asyncio.run(reader.read())
    assert (busy.value.status, busy.value.code) == (503, "engine_busy")
    assert client.futures[0].cancelled()  # the engine thread skips it

    class Dead:
        def kv_snapshot(self) -> concurrent.futures.Future[dict[str, Any]]:
            from pagedattn.server.engine_loop import EngineDeadError

            future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
            future.set_exception(EngineDeadError("the engine thread died: boom"))
            return future

    with pytest.raises(APIError) as dead:
        asyncio.run(SnapshotReader(Dead()).read())
    assert (dead.value.status, dead.value.code) == (503, "engine_unavailable")
    assert "boom" in dead.value.message


TIER_COUNTERS = {
    "pages_hit": "pagedattn:kv_store_pages_hit_total",
    "pages_missed": "pagedattn:kv_store_pages_missed_total",
    "pages_written": "pagedattn:kv_store_pages_written_total",
    "bytes_read": "pagedattn:kv_store_bytes_read_total",
    "bytes_written": "pagedattn:kv_store_bytes_written_total",
    "restored_tokens": "pagedattn:kv_store_restored_tokens_total",
}


def test_tier_counters_match_the_metrics(make_server: ServerFactory, tmp_path: Path) -> None:
    # two servers on one disk store: the second restores what the first wrote
    prompt = list(range(20, 45))  # 25 tokens: 6 full pages of 4
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    for round_ in range(2):
        with make_server(num_pages=64, kv_store=str(tmp_path / "kv")) as srv:
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).raise_for_status()
            srv.wait_idle()
            for _ in range(100):  # the tier writes in the background: read between two equal
                metrics = srv.metrics()
                tier = state(srv.url)["counters"]["tier"]
                if srv.metrics() == metrics:
                    break
                time.sleep(0.05)
        assert tier is not None and tier["backend"] == "disk"
        for key, metric in TIER_COUNTERS.items():
            assert tier[key] == metrics[f'{metric}{{backend="disk"}}'], (round_, key)
    assert tier["pages_hit"] == 6 and tier["restored_tokens"] == 24  # the second round's hits


def test_history_rates_are_deltas_over_the_interval() -> None:
    stats: dict[str, Any] = {
        "evictions": {"lru": 0, "sliding_window": 0, "lossy": 0},
        "num_preemptions": 0, "prefix_cache_queries": 0, "prefix_cache_hits": 0,
        "num_pages": 100, "num_free_pages": 100,
        "kv_store": {"pages_hit": 0, "pages_written": 0, "bytes_read": 0, "bytes_written": 0},
    }  # fmt: skip
    history = CounterHistory(lambda: stats, interval_s=2.0, window_s=6.0)
    history.sample(now=100.0)
    stats["evictions"] = {"lru": 6, "sliding_window": 2, "lossy": 0}
    stats.update(num_preemptions=1, prefix_cache_queries=40, prefix_cache_hits=10)
    stats["num_free_pages"] = 70
    stats["kv_store"] = {"pages_hit": 4, "pages_written": 8, "bytes_read": 400, "bytes_written": 0}
    history.sample(now=102.0)
    (point,) = history.points()
    assert (point.time, point.interval_s, point.used_pages) == (102.0, 2.0, 30)
    assert (point.evictions_per_s, point.preemptions_per_s) == (4.0, 0.5)
    assert point.prefix_cache_hit_ratio == 0.25
    assert (point.tier_pages_read_per_s, point.tier_pages_written_per_s) == (2.0, 4.0)
    assert (point.tier_bytes_read_per_s, point.tier_bytes_written_per_s) == (200.0, 0.0)
    for t in (104.0, 106.0, 108.0):
        history.sample(now=t)
    points = history.points()  # a 6 s window holds 4 samples: 3 intervals, the oldest gone
    assert [p.time for p in points] == [104.0, 106.0, 108.0]
    assert points[-1].prefix_cache_hit_ratio is None and points[-1].evictions_per_s == 0.0


def test_pages_written_after_the_last_step_reach_the_metrics(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    # the writer thread finishes after the engine went idle: /metrics still counts its pages
    prompt = list(range(20, 45))  # 25 tokens: 6 full pages of 4
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    with make_server(num_pages=64, kv_store=str(tmp_path / "kv")) as srv:
        store = srv.app.state.async_engine.engine.kv_tier.store
        written = 'pagedattn:kv_store_pages_written_total{backend="disk"}'
        release = threading.Event()
        write = store._write_raw

        def held_write(items: Any) -> int:
            release.wait(30)
            return int(write(items))

        assert srv.metrics()[written] == 0  # the start-up warm-up wrote nothing
        assert not [p for p in (tmp_path / "kv").rglob("*") if p.is_file()]
        store._write_raw = held_write
        httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).raise_for_status()
        assert srv.wait_idle()[written] == 0
        release.set()
        deadline = time.monotonic() + 20
        while srv.metrics()[written] < 6:
            assert time.monotonic() < deadline, srv.metrics()[written]
            time.sleep(0.05)
