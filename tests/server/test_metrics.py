"""/metrics after a known workload: exact counters, idle gauges, a parseable exposition."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import RunningServer, ServerFactory

PROMPTS = ["the cat sat on the mat", "hello world", "the cat sat on the mat"]
MAX_TOKENS = 5


def complete(srv: RunningServer, prompt: str) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_counters_and_histograms_after_a_known_workload(make_server: ServerFactory) -> None:
    with make_server(speculative="none") as srv:  # one token per step: plain decoding's counts
        idle = srv.metrics()
        assert idle["pagedattn:prompt_tokens_total"] == 0
        usages = [complete(srv, p)["usage"] for p in PROMPTS]
        m = srv.wait_idle()

    lens = [u["prompt_tokens"] for u in usages]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert lens == [13, 8, 13]
    assert cached == [0, 0, 12]  # the repeat reuses 3 full pages of 4 tokens
    assert m["pagedattn:prompt_tokens_total"] == 34
    assert m["pagedattn:generation_tokens_total"] == 3 * MAX_TOKENS
    assert m["pagedattn:prefix_cache_queries_total"] == 34
    assert m["pagedattn:prefix_cache_hits_total"] == 12
    assert m["pagedattn:num_preemptions_total"] == 0
    assert m['pagedattn:request_success_total{finished_reason="length"}'] == 3
    for reason in ("stop", "abort", "context_length_exceeded", "cache_capacity_exceeded"):
        assert m[f'pagedattn:request_success_total{{finished_reason="{reason}"}}'] == 0
    assert m['pagedattn:page_evictions_total{reason="lru"}'] == 0
    # one TTFT and one e2e per request, one inter-token gap per later token
    assert m["pagedattn:time_to_first_token_seconds_count"] == 3
    assert m["pagedattn:e2e_request_latency_seconds_count"] == 3
    assert m["pagedattn:inter_token_latency_seconds_count"] == 3 * (MAX_TOKENS - 1)
    # requests ran one at a time: each step had one sequence; the steps computed every
    # uncached prompt token and every generated token but the last of each request
    steps = m["pagedattn:iteration_num_seqs_count"]
    assert m["pagedattn:iteration_num_seqs_sum"] == steps == 3 * MAX_TOKENS
    assert m["pagedattn:iteration_tokens_total_sum"] == (34 - 12) + 3 * (MAX_TOKENS - 1)
    # one model forward per step, each taking some time
    assert m["pagedattn:model_forward_time_seconds_count"] == steps
    assert m["pagedattn:model_forward_time_seconds_sum"] > 0
    # idle gauges
    assert m["pagedattn:num_requests_running"] == 0
    assert m["pagedattn:num_requests_waiting"] == 0
    assert m["pagedattn:kv_cache_usage_perc"] == 0
    assert m["pagedattn:num_used_pages"] == 0
    assert m["pagedattn:num_free_pages"] == m["pagedattn:num_pages"] == 256


def test_exposition_parses_and_has_the_documented_families(server: RunningServer) -> None:
    r = httpx.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f.type for f in text_string_to_metric_families(r.text)}
    expected = {
        "pagedattn:num_requests_running": "gauge",
        "pagedattn:num_requests_waiting": "gauge",
        "pagedattn:kv_cache_usage_perc": "gauge",
        "pagedattn:num_free_pages": "gauge",
        "pagedattn:num_used_pages": "gauge",
        "pagedattn:prompt_tokens": "counter",
        "pagedattn:generation_tokens": "counter",
        "pagedattn:prefix_cache_queries": "counter",
        "pagedattn:prefix_cache_hits": "counter",
        "pagedattn:num_preemptions": "counter",
        "pagedattn:request_success": "counter",
        "pagedattn:page_evictions": "counter",
        "pagedattn:time_to_first_token_seconds": "histogram",
        "pagedattn:inter_token_latency_seconds": "histogram",
        "pagedattn:e2e_request_latency_seconds": "histogram",
        "pagedattn:iteration_tokens_total": "histogram",
        "pagedattn:iteration_num_seqs": "histogram",
        "pagedattn:model_forward_time_seconds": "histogram",
    }
    assert {k: families.get(k) for k in expected} == expected


def test_preemptions_and_evictions_are_counted(make_server: ServerFactory) -> None:
    """A pool too small for two long requests at once forces a preemption."""
    import asyncio

    async def run(srv: RunningServer) -> list[int]:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}
            rs = await asyncio.gather(
                *(
                    c.post(f"{srv.url}/v1/completions", json={**body, "prompt": p})
                    for p in ["hello world", "the cat sat"]
                )
            )
        return [r.status_code for r in rs]

    with make_server(num_pages=16) as srv:
        assert asyncio.run(run(srv)) == [200, 200]
        m = srv.wait_idle()
    assert m["pagedattn:num_preemptions_total"] >= 1
    assert m["pagedattn:generation_tokens_total"] == 80
    # a recompute after preemption is neither a prefix-cache query nor a hit
    assert m["pagedattn:prefix_cache_queries_total"] == m["pagedattn:prompt_tokens_total"]
    assert m["pagedattn:num_used_pages"] == 0


def _slow_runner(srv: RunningServer, monkeypatch: Any, first_s: float, each_s: float) -> None:
    engine = srv.app.state.async_engine.engine
    real = engine.runner.run
    calls = {"n": 0}

    def run(batch: Any) -> Any:
        calls["n"] += 1
        time.sleep(first_s if calls["n"] == 1 else each_s)
        return real(batch)

    monkeypatch.setattr(engine.runner, "run", run)


def test_ttft_includes_the_time_queued_behind_a_running_step(
    make_server: ServerFactory, monkeypatch: Any
) -> None:
    with make_server() as srv:
        _slow_runner(srv, monkeypatch, first_s=2.0, each_s=0.0)
        first = threading.Thread(target=complete, args=(srv, "hello world"))
        first.start()
        time.sleep(0.2)  # the second request arrives while the first step runs
        t0 = time.monotonic()
        complete(srv, "the cat sat on the mat")
        waited = time.monotonic() - t0
        first.join(30)
        m = srv.wait_idle()
    assert waited > 1.5
    assert m["pagedattn:time_to_first_token_seconds_count"] == 2
    # both requests waited for the 2 s step: neither TTFT is below 1 s
    assert m['pagedattn:time_to_first_token_seconds_bucket{le="1.0"}'] == 0
    assert m['pagedattn:e2e_request_latency_seconds_bucket{le="1.0"}'] == 0


def test_counts_stay_exact_under_preemption_aborts_and_max_tokens_1(
    make_server: ServerFactory, monkeypatch: Any
) -> None:
    prompts = ["the cat sat on the mat", "hello world and more", "the dog sat", "a b c d e"]
    with make_server(num_pages=12) as srv:  # 12 pages of 4 tokens: the requests preempt
        _slow_runner(srv, monkeypatch, first_s=0.0, each_s=0.02)
        bodies = [
            {"prompt": p, "max_tokens": 20, "temperature": 0, "ignore_eos": True} for p in prompts
        ]
        bodies += [{**bodies[0], "max_tokens": 1}, {**bodies[1], "max_tokens": 1}]
        results: list[int] = []

        def post(body: dict[str, Any]) -> None:
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            results.append(r.status_code)

        def aborted() -> None:  # a stream the client drops after its first token
            body = {**bodies[2], "max_tokens": 30, "stream": True}  # fits the pool
            with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"text":""' not in line:
                        return

        clients = [threading.Thread(target=post, args=(b,)) for b in bodies]
        clients.append(threading.Thread(target=aborted))
        for c in clients:
            c.start()
        for c in clients:
            c.join(60)
        too_long = {"prompt": "word " * 600, "max_tokens": 3}
        r = httpx.post(f"{srv.url}/v1/completions", json=too_long, timeout=60)
        assert r.status_code == 400
        m = srv.wait_idle()
    assert results == [200] * 6
    assert m["pagedattn:num_preemptions_total"] > 0
    success = {
        k.split('"')[1]: v for k, v in m.items() if k.startswith("pagedattn:request_success_total")
    }
    assert success["length"] == 6 and success["abort"] == 1
    assert success["context_length_exceeded"] == 1 and success["stop"] == 0
    # every request produced tokens: one TTFT and one e2e each, one inter-token gap per token
    # after a request's first
    assert m["pagedattn:time_to_first_token_seconds_count"] == 7
    assert m["pagedattn:e2e_request_latency_seconds_count"] == 7
    generated = m["pagedattn:generation_tokens_total"]
    assert m["pagedattn:inter_token_latency_seconds_count"] == generated - 7
