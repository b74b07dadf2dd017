"""Server under faults: a dead engine thread is a 503 at once (never a hang, never a silent
restart), an engine error mid-stream ends the SSE stream with an error event, a request
aborted by shutdown is never "stop", /health answers while the engine is busy and reports a
stall, and one request forced towards padded vocabulary ids costs the others nothing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.app import create_app
from tests.engine.faults import RowFaultModel
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf
from tests.server.conftest import RunningServer, ServerFactory, serve_app
from tests.server.test_errors import GOOD, assert_error_shape, assert_good_request_works


class Died(BaseException):
    """Escapes every ``except Exception``: kills the engine thread."""


def sse_events(r: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE body ("[DONE]" stays a string)."""
    events = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def slow_steps(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, delay_s: float) -> None:
    real = engine.runner.run

    def run(batch: Any) -> Any:
        time.sleep(delay_s)
        return real(batch)

    monkeypatch.setattr(engine.runner, "run", run)


def test_dead_engine_thread_is_a_503_at_once_and_never_restarted(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_server() as srv:
        assert_good_request_works(srv)
        loop = srv.app.state.async_engine
        thread = loop._thread

        def die() -> Any:
            raise Died("injected")

        monkeypatch.setattr(loop.engine, "step", die)
        t0 = time.monotonic()
        r = httpx.post(f"{srv.url}/v1/completions", json=GOOD, timeout=30)
        assert "Died" in assert_error_shape(r, 503)["message"]
        r = httpx.post(f"{srv.url}/v1/completions", json={**GOOD, "stream": True}, timeout=30)
        assert_error_shape(r, 503)
        assert time.monotonic() - t0 < 10
        for _ in range(2):  # /health reports it and starts nothing
            h = httpx.get(f"{srv.url}/health", timeout=5)
            assert h.status_code == 503 and "died" in h.json()["error"]["message"]
        assert loop._thread is thread and not thread.is_alive()
        assert thread not in threading.enumerate()


def test_engine_error_mid_stream_ends_with_an_error_event(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.app.state.async_engine.engine
    calls = {"n": 0}
    real = engine.runner.run

    def run(batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 4:  # after three tokens were streamed
            raise RuntimeError("kernel exploded")
        return real(batch)

    monkeypatch.setattr(engine.runner, "run", run)
    body = {**GOOD, "max_tokens": 8, "stream": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    events = sse_events(r)
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert texts and all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    final = events[-1]
    assert set(final) == {"error"} and "kernel exploded" in final["error"]["message"]
    assert final["error"]["code"] == "engine_error"
    monkeypatch.undo()
    assert_good_request_works(server)
    assert server.wait_idle()["pagedattn:num_used_pages"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_request_aborted_by_shutdown_is_a_503_never_stop(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    with make_server() as srv:
        loop = srv.app.state.async_engine
        slow_steps(loop.engine, monkeypatch, 0.05)
        body = {**GOOD, "max_tokens": 400, "stream": stream}
        result: dict[str, httpx.Response] = {}

        def post() -> None:
            result["r"] = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)

        client = threading.Thread(target=post)
        client.start()
        deadline = time.monotonic() + 30
        while loop.stats["num_generation_tokens"] < 3:  # it is decoding
            assert time.monotonic() < deadline
            time.sleep(0.02)
        loop.stop()
        client.join(30)
        r = result["r"]
        if stream:
            events = sse_events(r)
            assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
            assert (
                set(events[-1]) == {"error"} and "shutting down" in events[-1]["error"]["message"]
            )
        else:
            assert "shutting down" in assert_error_shape(r, 503)["message"]
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 503


def poll_health(srv: RunningServer, status: int, timeout_s: float = 30.0) -> httpx.Response:
    """GET /health until it answers ``status`` (bounded; each answer must come at all)."""
    deadline = time.monotonic() + timeout_s
    while True:
        h = httpx.get(f"{srv.url}/health", timeout=10)
        if h.status_code == status or time.monotonic() > deadline:
            return h
        time.sleep(0.05)


def test_health_answers_while_a_prompt_is_tokenised_and_reports_a_stall(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_server(health_stall_s=0.5) as srv:
        engine = srv.app.state.async_engine.engine
        real = engine.tokenizer.apply_chat_template
        rendering, release = threading.Event(), threading.Event()

        def held_template(*args: Any, **kwargs: Any) -> Any:
            rendering.set()  # a long prompt's rendering and tokenisation, held until released
            assert release.wait(60)
            return real(*args, **kwargs)

        monkeypatch.setattr(engine.tokenizer, "apply_chat_template", held_template)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        done: dict[str, int] = {}
        client = threading.Thread(
            target=lambda: done.update(
                status=httpx.post(
                    f"{srv.url}/v1/chat/completions", json=chat, timeout=60
                ).status_code
            )
        )
        client.start()
        try:
            assert rendering.wait(30)
            # the prompt is still being prepared: /health answers, and healthy (nothing pending)
            h = httpx.get(f"{srv.url}/health", timeout=10)
            assert h.status_code == 200 and h.json() == {"status": "ok"}
        finally:
            release.set()
        client.join(60)
        assert done["status"] == 200
        monkeypatch.undo()

        # a step held with a request pending: a stall once 0.5 s passed, healthy once released
        real_run = engine.runner.run
        stepping, unstick = threading.Event(), threading.Event()

        def stuck(batch: Any) -> Any:
            if not unstick.is_set():
                stepping.set()
                assert unstick.wait(60)
            return real_run(batch)

        monkeypatch.setattr(engine.runner, "run", stuck)
        client = threading.Thread(target=lambda: assert_good_request_works(srv))
        client.start()
        try:
            assert stepping.wait(30)
            h = poll_health(srv, 503)
            assert h.status_code == 503 and "no progress" in h.json()["error"]["message"]
        finally:
            unstick.set()
        client.join(60)
        assert poll_health(srv, 200).status_code == 200


def test_stop_never_lets_two_threads_drive_one_engine(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_server() as srv:
        loop = srv.app.state.async_engine
        in_step = threading.Event()
        real = loop.engine.runner.run

        def slow(batch: Any) -> Any:
            in_step.set()
            time.sleep(1.0)
            return real(batch)

        monkeypatch.setattr(loop.engine.runner, "run", slow)
        url = f"{srv.url}/v1/completions"
        client = threading.Thread(target=lambda: httpx.post(url, json=GOOD, timeout=60))
        client.start()
        assert in_step.wait(30)  # the engine thread is inside a 1 s step
        thread = loop._thread
        before = set(threading.enumerate())
        loop.stop(timeout_s=0.05)  # times out: the thread is still busy
        assert thread.is_alive() and not loop.is_running
        loop.start()  # must not start a second driver
        assert loop._thread is thread and set(threading.enumerate()) <= before
        thread.join(10)
        client.join(30)
        assert not thread.is_alive() and set(threading.enumerate()) <= before


def test_request_forced_towards_a_padded_id_costs_the_others_nothing(
    tmp_path: Path,
) -> None:
    tokenizer = load_model(
        write_tiny_gguf(tmp_path / "t.gguf", tiny_config(), random_weights(tiny_config(), 2))
    ).tokenizer
    config = tiny_config(vocab_size=300)  # 28 padded embedding rows
    model = LlamaModel(config, random_weights(config, 2))
    long_prompt = "the cat sat on the mat and the dog sat on the log"
    n_long = len(tokenizer.encode(long_prompt))
    prompts = {"forced": long_prompt, "a": "hello world", "b": "the cat"}
    options = EngineConfig(
        cache=CacheConfig(page_size=4, num_pages=64), scheduler=SchedulerConfig()
    )

    def solo(prompt: str) -> str:
        engine = LLMEngine(options, model, tokenizer)
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        text = ""
        while engine.has_unfinished_requests():
            text += "".join(o.outputs[0].text for o in engine.step())
        return text

    faulty = RowFaultModel(model, "padded", n_long - 1, padded_id=290)
    app = create_app(LLMEngine(options, faulty, tokenizer), model_name="padded")
    with serve_app(app) as srv:
        results: dict[str, dict[str, Any]] = {}

        def ask(key: str) -> None:
            body = {**GOOD, "prompt": prompts[key], "max_tokens": 6}
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            results[key] = r.json()

        clients = [threading.Thread(target=ask, args=(k,)) for k in prompts]
        for c in clients:
            c.start()
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 200
        for c in clients:
            c.join(60)
        for key in ("a", "b"):
            assert results[key]["choices"][0]["text"] == solo(prompts[key]), key
        forced = results["forced"]
        assert forced["usage"]["completion_tokens"] == 6
        assert forced["choices"][0]["text"] == solo(prompts["forced"])  # 290 masked away
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 200
        m = srv.wait_idle()
        assert m["pagedattn:num_used_pages"] == 0


class WatchedBackend:
    """A tokenizer backend that flags when it is inside an encode of a long text."""

    def __init__(self, backend: Any, min_chars: int) -> None:
        self.backend = backend
        self.min_chars = min_chars
        self.inside = threading.Event()
        self.finished = threading.Event()

    def _watch(self, name: str, text_of: Any) -> Any:
        real = getattr(self.backend, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            watched = len(text_of(args)) >= self.min_chars
            if watched:
                self.inside.set()
            try:
                return real(*args, **kwargs)
            finally:
                if watched:
                    self.finished.set()

        return call

    def __getattr__(self, name: str) -> Any:
        if name == "encode":
            return self._watch(name, lambda args: args[0])
        if name in ("encode_batch", "encode_batch_fast"):
            return self._watch(name, lambda args: args[0][0])
        return getattr(self.backend, name)


def test_health_answers_while_the_real_tokenizer_encodes_a_long_text(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real tokenizer on a 3 MB text (within the byte bound of a 1M-token context):
    /health answers while that encode is running, so neither the event loop nor the GIL is
    held by it."""
    with make_server(max_model_len=1 << 20) as server:
        _health_while_encoding(server, monkeypatch)


def _health_while_encoding(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = server.app.state.async_engine.engine.tokenizer
    watched = WatchedBackend(tokenizer.backend, min_chars=1_000_000)
    monkeypatch.setattr(tokenizer, "backend", watched)
    text = "the cat sat on the mat and the dog sat on the log " * 60_000  # 3 MB
    done: dict[str, httpx.Response] = {}
    client = threading.Thread(
        target=lambda: done.update(
            r=httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=300)
        )
    )
    client.start()
    assert watched.inside.wait(60)
    answered_inside = 0
    while not watched.finished.is_set():
        h = httpx.get(f"{server.url}/health", timeout=60)
        if watched.finished.is_set():
            break  # this answer may have waited for the encode: it does not count
        assert h.status_code == 200
        answered_inside += 1
    client.join(300)
    assert done["r"].status_code == 200 and done["r"].json()["count"] > 60_000
    assert answered_inside >= 1, "/health never answered while the prompt was being encoded"
