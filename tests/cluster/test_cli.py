"""`pagedattn serve --replicas 2 --kv-store redis://...` as a user runs it: a process of its
own (its own local Ray cluster), the official openai client against it, and SIGTERM, after
which no process it started (Ray's, the replicas') is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from pagedattn.cluster.ingress import REPLICA_HEADER
from tests.cluster.conftest import wait_for
from tests.redis_server import RedisServer, free_port

SERVE = "import sys; from pagedattn.cli import main; sys.argv[0] = 'pagedattn'; main()"


def _ready(url: str, proc: subprocess.Popen[str]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"pagedattn serve exited with {proc.returncode}")
    try:
        return httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _replicas(url: str) -> set[str]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        line.split('replica="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("pagedattn:num_pages{") and 'replica="' in line
    }


def test_serve_replicas_serves_the_openai_client_and_stops_on_sigterm(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    from openai import OpenAI

    redis = RedisServer()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--model", str(tiny_gguf), "--replicas", "2", "--kv-store", redis.url]
    args += ["--port", str(port), "--page-size", "4", "--num-pages", "128"]
    args += ["--max-request-bytes", "2000", "--log-level", "warning"]
    log = (tmp_path / "serve.log").open("w")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a cluster of its own
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, *args], stdout=log, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    started: list[psutil.Process] = []
    try:
        wait_for(lambda: _ready(url, proc), 240, "pagedattn serve --replicas 2")
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        assert model == "tiny"
        messages = [{"role": "user", "content": "Say something."}]
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=8, temperature=0
        )  # type: ignore[call-overload]
        whole = raw.parse()
        raw_stream = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=8, temperature=0, stream=True
        )  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in raw_stream.parse() if c.choices)
        assert whole.usage is not None and whole.usage.completion_tokens == 8
        assert text == whole.choices[0].message.content
        wait_for(lambda: len(_replicas(url)) == 2, 30, "both replicas in /metrics")
        replicas = _replicas(url)
        assert raw.headers[REPLICA_HEADER] in replicas
        assert raw_stream.headers[REPLICA_HEADER] in replicas
        # the server options reach the cluster too: the ingress's body limit
        big = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "x" * 4000})
        assert big.status_code == 413, big.text
        assert big.json()["error"]["code"] == "request_too_large"
        started = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in started), [p.name() for p in started]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:  # the test failed: take everything it started down
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                p.kill()
            proc.wait()
        log.close()
        redis.stop()
    deadline = time.monotonic() + 30
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.name()) for p in left]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/v1/models", timeout=2)
