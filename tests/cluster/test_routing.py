"""Prefix-aware routing on 2 replicas: affinity of multi-turn chats, spread of distinct
prefixes, the load guard under one hot prefix, the official openai client, /metrics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from pagedattn.cluster.ingress import REPLICA_HEADER
from tests.cluster.conftest import Cluster

CLUSTER_OPTIONS = {"max_load_spread": 2}

SYSTEM = "You are a terse assistant. Answer every question in a few words, no more. " * 2


def _restored(c: Cluster) -> float:
    return sum(v for k, v in c.metrics().items() if k.startswith("pagedattn:kv_store_restored"))


def test_each_turn_lands_on_the_replica_of_the_previous_turn(cluster: Cluster) -> None:
    chats = [
        [
            {"role": "system", "content": f"chat {chat}: {SYSTEM}"},
            {"role": "user", "content": f"Question {chat}: what is {chat} plus {chat}?"},
        ]
        for chat in range(4)
    ]
    previous: dict[int, str] = {}
    restored_after_first_turns = 0.0
    for turn in range(3):
        if turn == 1:
            time.sleep(1.5)  # the replicas' reports catch up
            restored_after_first_turns = _restored(cluster)
        for chat, messages in enumerate(chats):
            r = cluster.chat(messages)
            assert r.status_code == 200, r.text
            replica = r.headers[REPLICA_HEADER]
            body = r.json()
            if turn > 0:
                assert replica == previous[chat], f"chat {chat} turn {turn} moved replicas"
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            previous[chat] = replica
            messages += [
                {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"And then turn {turn}?"},
            ]
    time.sleep(1.5)
    # the later turns' history came from the replica's own pool, not from the tier
    assert _restored(cluster) == restored_after_first_turns
    assert cluster.metrics()['pagedattn:router_requests_total{reason="prefix"}'] >= 8


def test_distinct_prefixes_spread_over_both_replicas(cluster: Cluster) -> None:
    def first_turn(i: int) -> str:
        msg = [{"role": "user", "content": f"{i} distinct opening number {i * 7919} here"}]
        r = cluster.chat(msg, max_tokens=24, ignore_eos=True)
        assert r.status_code == 200, r.text
        return r.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(first_turn, range(8)))
    assert len(set(served)) == 2, served


def test_one_hot_prefix_is_spread_by_the_load_guard(cluster: Cluster) -> None:
    hot = [{"role": "system", "content": "hot prefix " + SYSTEM}]
    first = cluster.chat([*hot, {"role": "user", "content": "seed"}])
    assert first.status_code == 200
    before = cluster.metrics()['pagedattn:router_requests_total{reason="load"}']

    def ask(i: int) -> str:
        r = cluster.chat(
            [*hot, {"role": "user", "content": f"q{i}"}], max_tokens=48, ignore_eos=True
        )
        assert r.status_code == 200, r.text
        return r.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(10) as pool:
        served = list(pool.map(ask, range(10)))
    assert len(set(served)) == 2, served
    assert cluster.metrics()['pagedattn:router_requests_total{reason="load"}'] > before


def test_official_openai_client_streams_and_completes(cluster: Cluster) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True
    )  # type: ignore[arg-type]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert whole.choices[0].message.content == text
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    bad = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        json={"messages": messages, "temperature": -1},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"


def test_metrics_show_each_replica_and_the_router(cluster: Cluster) -> None:
    m = cluster.metrics()
    replicas = cluster.replicas()
    assert len(replicas) == 2
    for r in replicas:
        assert m[f'pagedattn:num_pages{{replica="{r}"}}'] == 256
    total = sum(
        m[f'pagedattn:router_requests_total{{reason="{x}"}}']
        for x in ("prefix", "load", "no_match")
    )
    assert total >= 20
    assert m["pagedattn:router_matched_pages_total"] > 0


def test_the_load_generator_runs_unchanged_against_the_cluster(cluster: Cluster) -> None:
    import subprocess
    import sys
    from pathlib import Path

    load = Path(__file__).resolve().parents[2] / "benchmarks" / "online" / "load.py"
    args = ["--url", cluster.url, "--rates", "inf", "--concurrency", "4"]
    args += ["--num-requests", "8", "--max-tokens", "6"]
    time.sleep(1.5)  # earlier tests' counters reach /metrics (0.5 s reports)
    before = cluster.metrics()
    done = subprocess.run(
        [sys.executable, str(load), *args], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert "8/8" in done.stdout and "failed" not in done.stdout, done.stdout
    time.sleep(1.5)  # the replicas' counters reach /metrics
    after = cluster.metrics()

    def generated(m: dict[str, float]) -> float:
        return sum(v for k, v in m.items() if k.startswith("pagedattn:generation_tokens_total{"))

    assert generated(after) - generated(before) == 8 * 6


def test_the_dashboard_queries_only_families_the_ingress_exposes(cluster: Cluster) -> None:
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pagedattn-dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    from prometheus_client.parser import text_string_to_metric_families

    exposed = set()  # every family's sample names, those without samples yet included
    for family in text_string_to_metric_families(httpx.get(f"{cluster.url}/metrics").text):
        exposed |= {family.name + x for x in ("", "_total", "_bucket", "_sum", "_count")}
    used = {m for e in exprs for m in re.findall(r"pagedattn:[a-z0-9_]+", e)}
    assert used - exposed == set()
    assert any(m.startswith("pagedattn:router_") for m in used)
    replica = next(v for v in dashboard["templating"]["list"] if v["name"] == "replica")
    query = replica["query"]["query"]
    assert query.startswith("label_values(") and query.endswith(", replica)"), query
    # every replica family's query filters on the template variable and keeps the label
    for e in exprs:
        if re.search(r"pagedattn:(?!router_|ingress_)", e):
            assert 'replica=~"$replica"' in e, e
            assert "sum(" not in e.replace("sum(rate(pagedattn:router", ""), e
