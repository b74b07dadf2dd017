"""A replica that dies: its sessions continue on another replica from the Redis tier with the
text a single-process server gives; a stream in flight on it ends with an error event; the
retry succeeds and Ray brings the replica back without a page leak on the survivor."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import ray
from fastapi.testclient import TestClient

from pagedattn.cluster.ingress import REPLICA_HEADER
from pagedattn.server.app import build_app
from tests.cluster.conftest import OPTIONS, Cluster, replica_actor, wait_for

HISTORY = "Remember this long story about a lighthouse keeper and the sea. " * 3


def _with_retry(c: Cluster, messages: list[dict[str, str]]) -> httpx.Response:
    """A client retrying 503s (the dead replica's requests) for at most 30 s."""
    deadline = time.monotonic() + 30
    while True:
        r = c.chat(messages)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def test_a_session_moves_to_the_survivor_through_the_tier(cluster: Cluster) -> None:
    messages = [{"role": "user", "content": HISTORY}]
    first = cluster.chat(messages)
    assert first.status_code == 200, first.text
    victim = first.headers[REPLICA_HEADER]
    messages += [
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
        {"role": "user", "content": "What did the keeper see?"},
    ]
    time.sleep(1.0)  # the victim's pages reach Redis (write-through) and its report
    ray.kill(replica_actor(victim), no_restart=True)
    second = _with_retry(cluster, messages)
    assert second.status_code == 200, second.text
    assert second.headers[REPLICA_HEADER] != victim
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # oracle: a single-process server without any tier
    with TestClient(build_app(cluster.model, **OPTIONS)) as single:
        body: dict[str, Any] = {"messages": messages, "max_tokens": 8, "temperature": 0}
        alone = single.post("/v1/chat/completions", json=body)
    assert alone.status_code == 200
    got = second.json()["choices"][0]["message"]["content"]
    assert got == alone.json()["choices"][0]["message"]["content"]
    wait_for(lambda: len(cluster.replicas()) == 2, 90, "Ray to replace the killed replica")


def test_a_stream_on_a_dying_replica_ends_with_an_error_event(cluster: Cluster) -> None:
    wait_for(lambda: len(cluster.replicas()) == 2, 90, "two replicas")
    body = {
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[str] = []
    with httpx.stream("POST", f"{cluster.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        victim = r.headers[REPLICA_HEADER]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                ray.kill(replica_actor(victim), no_restart=True)
    assert events[-1] != "[DONE]"
    error = json.loads(events[-1])["error"]
    assert error["code"] == "engine_unavailable", error
    survivor = {r for r in cluster.replicas() if r != victim}
    retry = _with_retry(cluster, [{"role": "user", "content": "Tell a short story."}])
    assert retry.status_code == 200, retry.text
    assert retry.headers[REPLICA_HEADER] != victim
    wait_for(lambda: len(cluster.replicas() - {victim}) == 2, 90, "a new replica")
    m = cluster.metrics()
    for s in survivor:
        assert m[f'pagedattn:num_used_pages{{replica="{s}"}}'] == 0
