"""A reply with prompt logprobs of a long prompt (``prompt_logprobs: 20`` + ``echo`` +
``logprobs: 20``, megabytes of JSON) is built and serialised on a worker thread, never on the
event loop (where it would hold /health and every stream), on the embedded SmolLM2; the reply
holds one entry per prompt token with 20 alternatives each. The /health latency under that
load is measured by ``benchmarks/health_under_load.py logprobs``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

import pagedattn.server.serving as serving
from tests.server.conftest import RunningServer

PROMPT = "The lighthouse keeper climbed the stairs again, counting each step. " * 60


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.model
def test_a_large_logprob_reply_is_built_off_the_event_loop(
    smollm2_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool]] = []
    for name in ("completion_response", "batch_completion_response"):
        real = getattr(serving, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            seen.append((_name, _on_event_loop()))
            assert threading.current_thread() is not threading.main_thread()
            return _real(*args, **kwargs)

        monkeypatch.setattr(serving, name, spy)
    body = {
        "prompt": PROMPT,
        "max_tokens": 2,
        "temperature": 0,
        "echo": True,
        "logprobs": 20,
        "prompt_logprobs": 20,
    }
    r = httpx.post(f"{smollm2_server.url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    num_prompt = out["usage"]["prompt_tokens"]
    assert num_prompt > 700
    choice = out["choices"][0]
    assert len(choice["prompt_logprobs"]) == num_prompt and choice["prompt_logprobs"][0] is None
    assert all(len(e) >= 20 for e in choice["prompt_logprobs"][1:])
    assert len(choice["logprobs"]["tokens"]) == num_prompt + 2
    r = httpx.post(
        f"{smollm2_server.url}/v1/completions",
        json={**body, "prompt": [PROMPT, PROMPT[:400]]},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert seen == [("completion_response", False), ("batch_completion_response", False)]
