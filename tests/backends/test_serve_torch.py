"""`pagedattn serve`'s app on the torch backend answers an OpenAI completion request with the
text the NumPy backend generates."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from tests.server.conftest import serve_app


def test_completion_on_torch_equals_numpy_text(tiny_gguf: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from pagedattn.server.app import build_app

    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    want = LLM(str(tiny_gguf)).generate("the rain in", params, use_tqdm=False)[0]
    app = build_app(str(tiny_gguf), page_size=4, num_pages=64, backend="torch", device="cpu")
    engine = app.state.async_engine.engine
    assert str(engine.backend) == "torch/cpu" and type(engine.page_pool.kv).__module__ == "torch"
    with serve_app(app) as srv:
        body = {
            "model": "tiny", "prompt": "the rain in", "max_tokens": 10, "temperature": 0,
            "ignore_eos": True,
        }  # fmt: skip
        reply = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == want.outputs[0].text
