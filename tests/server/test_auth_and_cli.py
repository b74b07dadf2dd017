"""API-key auth (every route but /health) and `pagedattn serve` as a real subprocess."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServerFactory, serve_subprocess

KEY = "sk-test-123"


def test_api_key_is_required_everywhere_but_health(make_server: ServerFactory) -> None:
    import openai

    with make_server(api_key=KEY) as srv:
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/responses"),
            ("POST", "/invocations"),
            ("GET", "/load"),
        ]:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}]:
                r = httpx.request(method, srv.url + path, headers=headers, json={})
                assert r.status_code == 401, (path, headers)
                error = r.json()["error"]
                assert error["type"] == "authentication_error"
                assert error["code"] == "invalid_api_key"
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.get(f"{srv.url}/ping").status_code == 200

        good = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)
        out = good.completions.create(model="tiny-llama", prompt="hi", max_tokens=2)
        assert out.usage.completion_tokens + (out.choices[0].finish_reason == "stop") >= 1
        bad = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="nope", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.get(f"{srv.url}/metrics", headers=srv.headers).status_code == 200


def test_pagedattn_serve_subprocess(tiny_model_dir: Path) -> None:
    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--page-size", "8"]
    args += ["--num-pages", "32", "--max-model-len", "64", "--log-level", "warning"]
    args += ["--max-request-bytes", "2000"]
    with serve_subprocess(args, env={**os.environ, "PAGEDATTN_API_KEY": KEY}) as url:
        headers = {"Authorization": f"Bearer {KEY}"}
        models: Any = httpx.get(f"{url}/v1/models", headers=headers).json()
        assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 64)]
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 61}  # 4 + 61 > 64
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 4}, headers=headers)
        assert r.status_code == 200
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
        big = {**body, "prompt": "x" * 2000}  # the body passes --max-request-bytes
        r = httpx.post(f"{url}/v1/completions", json=big, headers=headers)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert "2000 bytes" in r.json()["error"]["message"]
        metrics = httpx.get(f"{url}/metrics", headers=headers).text
        assert 'pagedattn:num_pages{model_name="tiny"} 32.0' in metrics


def test_serve_without_the_server_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from pagedattn.cli import _register
    from pagedattn.cli.app import app

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ModuleNotFoundError
    _register()
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    assert "serve needs the server extra (uvicorn is missing)" in result.output
    assert "pip install 'pagedattn[model,server]'" in result.output
