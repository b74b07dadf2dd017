"""Two `pagedattn serve` processes on one Redis: a long prompt served by the first is served by
the second from the tier (usage.prompt_tokens_details.cached_tokens says so), with the same
answer; both export the kv_store metrics."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.redis_server import RedisServer
from tests.server.conftest import serve_subprocess
from tests.server.tiny_folder import write_tiny_folder

PROMPT = "the quick brown fox jumps over the lazy dog " * 12


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            kind = s.labels.get("kind")
            out[s.name + (f"[{kind}]" if kind else "")] = s.value
    return out


def _complete(url: str) -> dict[str, object]:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def test_second_server_serves_a_long_prompt_from_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    folder = write_tiny_folder(tmp_path / "tiny")
    args = ["--model", str(folder), "--served-model-name", "tiny", "--page-size", "4"]
    args += ["--num-pages", "512", "--kv-store", redis_server.url]
    with serve_subprocess(args) as first:
        one = _complete(first)
        usage = one["usage"]
        assert isinstance(usage, dict)
        prompt_tokens = usage["prompt_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        deadline = time.monotonic() + 30
        while _metrics(first)["pagedattn:kv_store_pages_written_total"] < prompt_tokens // 4:
            assert time.monotonic() < deadline, "the first server never wrote its pages"
            time.sleep(0.1)
        with serve_subprocess(args) as second:  # both up, one Redis
            two = _complete(second)
            usage = two["usage"]
            assert isinstance(usage, dict)
            restored = (prompt_tokens - 1) // 4 * 4
            assert usage["prompt_tokens_details"]["cached_tokens"] == restored
            assert two["choices"] == one["choices"]  # the same answer from restored pages
            m = _metrics(second)
            assert m["pagedattn:kv_store_restored_tokens_total"] == restored
            assert m["pagedattn:kv_store_up"] == 1.0
            assert m["pagedattn:kv_store_bytes_read_total"] > 0
            assert m["pagedattn:kv_store_get_latency_seconds_count"] >= 1
            assert m["pagedattn:kv_store_errors_total[checksum]"] == 0
