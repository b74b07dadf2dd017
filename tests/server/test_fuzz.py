"""Fuzz the app from its own OpenAPI schema with schemathesis (positive and negative bodies for
every operation, in-process ASGI calls; schemathesis' pytest plugin is not used): no request
gets a 5xx, every error has the OpenAI shape, and the engine still serves afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from pagedattn.server.app import build_app
from tests.server.tiny_folder import write_tiny_folder

schemathesis = pytest.importorskip("schemathesis")

OPTIONS = {"page_size": 4, "num_pages": 64, "max_model_len": 96, "default_max_tokens": 8}


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    folder = write_tiny_folder(tmp_path_factory.mktemp("fuzz") / "tiny-llama")
    app = build_app(str(folder), **OPTIONS)
    yield app
    app.state.async_engine.stop()


def cases(app: FastAPI) -> st.SearchStrategy[Any]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        strategies += [operation.as_strategy(generation_mode=m) for m in modes]
    assert len(strategies) >= 8  # completions, chat, models, health, metrics x 2 modes
    return st.one_of(strategies)


def test_no_request_is_a_server_error(fuzz_app: FastAPI) -> None:
    statuses: list[int] = []

    @given(case=cases(fuzz_app))
    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        response = case.call()
        statuses.append(response.status_code)
        assert response.status_code < 500, (case.path, case.body, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
    assert any(s == 200 for s in statuses) and any(400 <= s < 500 for s in statuses)


def test_engine_alive_after_fuzzing(fuzz_app: FastAPI) -> None:
    with TestClient(fuzz_app) as client:
        body = {"prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        engine = fuzz_app.state.async_engine.engine
    assert not engine.has_unfinished_requests()
    engine.cache_manager.check_integrity()
    assert engine.cache_manager.allocator.num_free_pages == engine.cache_manager.num_pages
