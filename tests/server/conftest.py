"""Server fixtures: the tiny HF-folder model, real uvicorn servers on free loopback ports
(in a thread; bounded start/stop), and OpenAI clients pointed at them."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pagedattn.server.app import build_app
from tests.fixtures import metric_samples
from tests.redis_server import free_port
from tests.server.tiny_folder import write_tiny_folder

START_TIMEOUT_S = 30.0
TINY_OPTIONS: dict[str, Any] = {"page_size": 4, "num_pages": 256, "max_num_seqs": 64}


@dataclass
class RunningServer:
    """A live server: ``url`` (``http://127.0.0.1:<port>``), the app, and a metrics reader."""

    url: str
    app: FastAPI
    api_key: str | None = None
    model_dir: Path | None = None  # the model folder, when the server serves one

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed ``name{label="v",...}`` (labels sorted, model_name
        dropped), parsed with prometheus_client's parser."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text
        return metric_samples(text)

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, float]:
        """Poll /metrics until no request runs or waits and no page is held (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            idle = (
                m["pagedattn:num_requests_running"] == 0
                and m["pagedattn:num_requests_waiting"] == 0
                and m["pagedattn:num_used_pages"] == 0
            )
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)


@contextmanager
def serve_app(
    app: FastAPI, api_key: str | None = None, model_dir: Path | None = None
) -> Iterator[RunningServer]:
    """Run ``app`` under uvicorn on a free loopback port in a daemon thread."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", app, api_key, model_dir)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_folder(tmp_path_factory.mktemp("server") / "tiny-llama")


ServerFactory = Callable[..., Any]


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (same weights) with an 8,192-token context: requests long enough that a
    client's hang-up always reaches the engine before they could end."""
    return write_tiny_folder(tmp_path_factory.mktemp("server") / "tiny-llama", context=8192)


@pytest.fixture(scope="session")
def make_server(tiny_model_dir: Path) -> Iterator[ServerFactory]:
    """``with make_server(**options) as srv:`` a fresh tiny-model server (own engine, metrics);
    ``model_dir=`` serves another folder."""

    @contextmanager
    def factory(
        api_key: str | None = None, model_dir: Path | None = None, **options: Any
    ) -> Iterator[RunningServer]:
        folder = model_dir or tiny_model_dir
        app = build_app(str(folder), api_key=api_key, **{**TINY_OPTIONS, **options})
        with serve_app(app, api_key, folder) as srv:
            yield srv

    yield factory


@pytest.fixture(scope="session")
def server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """One tiny-model server shared by the session (page_size 4, 256 pages)."""
    with make_server() as srv:
        yield srv


@pytest.fixture
def client(server: RunningServer) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=60, max_retries=0)


@contextmanager
def serve_subprocess(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[str]:
    """Run ``pagedattn serve ARGS --port <free port>`` in a subprocess, wait until /health
    answers 200 (failing with its output if it exits first), yield its base URL, stop it."""
    port = free_port()
    cmd = [sys.executable, "-c", "from pagedattn.cli import main; main()", "serve"]
    cmd += [*args, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[RunningServer]:
    """The embedded SmolLM2-135M-Instruct served in-process (64 MiB of KV), shared by the
    session."""
    with serve_app(build_app(None, kv_cache_mib=64)) as srv:
        yield srv
