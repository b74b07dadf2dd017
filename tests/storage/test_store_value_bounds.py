"""A huge value written at a page record's Redis name costs the server one bounded read: `pagedattn
serve` (the embedded SmolLM2) answers the prompt whose pages were overwritten with the same text
as before, the oversized values are counted misses (``size``), deleted, and Redis sends the server
no more than a record's bytes for each (never the value whole). A KVStream state file larger
than its stream can have saved is refused from its size."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from pagedattn.server.app import build_app
from pagedattn.storage.record import RecordError
from pagedattn.stream.kv_stream import KVStream
from tests.redis_server import RedisServer
from tests.server.conftest import RunningServer, serve_app

PROMPT = "Tell me a short story about a lighthouse keeper and a storm at sea. " * 3
HUGE = 64 * 1024 * 1024


def _complete(srv: RunningServer) -> dict[str, object]:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def _sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


@pytest.mark.model
def test_a_huge_value_at_a_page_name_is_a_counted_bounded_miss(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=30)
    with serve_app(build_app(None, kv_cache_mib=64, kv_store=redis_server.url)) as first:
        one = _complete(first)
        deadline = time.monotonic() + 30
        while not (keys := sorted(client.scan_iter("pagedattn:*:page:*"))):
            assert time.monotonic() < deadline, "the server never wrote its pages"
            time.sleep(0.1)
        time.sleep(0.5)  # the write-through finishes the request's pages
        keys = sorted(client.scan_iter("pagedattn:*:page:*"))
        record = max(len(client.getrange(k, 0, 1 << 30)) for k in keys[:1])
    for key in keys:
        client.set(key, b"\0" * HUGE)
    with serve_app(build_app(None, kv_cache_mib=64, kv_store=redis_server.url)) as second:
        before = _sent(client)
        two = _complete(second)
        sent = _sent(client) - before
        m = second.metrics()
    assert two["choices"] == one["choices"]  # recomputed, the same answer
    usage = two["usage"]
    assert isinstance(usage, dict) and usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert m['pagedattn:kv_store_errors_total{backend="redis",kind="size"}'] >= 1
    assert sent < len(keys) * (record + 4096)  # at most a record's bytes per name
    assert sent < HUGE
    assert not any(client.strlen(k) == HUGE for k in keys[:1])  # the bad value is deleted


def test_an_oversized_stream_file_is_refused_from_its_size(tmp_path: Path) -> None:
    config = {"num_heads": 2, "num_kv_heads": 1, "head_dim": 8, "page_size": 4, "max_pages": 3}
    rng = np.random.default_rng(0)
    stream = KVStream(**config)  # type: ignore[arg-type]
    for _ in range(9):
        q = rng.standard_normal((2, 8)).astype(np.float32)
        k = rng.standard_normal((1, 8)).astype(np.float32)
        stream.step(q, k, k)
    path = tmp_path / "s.kvs"
    stream.save(path)
    KVStream(**config).load(path)  # type: ignore[arg-type]  # a file it saved loads
    path.write_bytes(path.read_bytes() + b"\0" * (4 << 20))
    with pytest.raises(RecordError, match="more than a stream of 3 pages saves") as err:
        KVStream(**config).load(path)  # type: ignore[arg-type]
    assert err.value.kind == "size"
