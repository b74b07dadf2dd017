"""/tokenize and /detokenize take the generation routes' size limits on the embedded SmolLM2:
a prompt or conversation too long in bytes for the context is refused before it is tokenised
(the same 400 the completions route gives), too many ids to detokenize are refused, and
requests within the limits still answer as before."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import RunningServer
from tests.server.test_errors import assert_error_shape

BIG = "lorem ipsum dolor sit amet " * 150_000  # about 4 MB


@pytest.mark.model
def test_tokenize_refuses_what_completions_refuses(smollm2_server: RunningServer) -> None:
    url = smollm2_server.url
    gen = httpx.post(f"{url}/v1/completions", json={"prompt": BIG, "max_tokens": 1}, timeout=60)
    gen_err = assert_error_shape(gen, 400)
    assert gen_err["code"] == "context_length_exceeded" and gen_err["param"] == "prompt"
    r = httpx.post(f"{url}/tokenize", json={"prompt": BIG}, timeout=60)
    err = assert_error_shape(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    chat = {"messages": [{"role": "user", "content": BIG}]}
    r = httpx.post(f"{url}/tokenize", json=chat, timeout=60)
    err = assert_error_shape(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    # many small messages whose rendered conversation is too long
    many = {"messages": [{"role": "user", "content": BIG[:40_000]}] * 60}
    r = httpx.post(f"{url}/tokenize", json=many, timeout=60)
    assert assert_error_shape(r, 400)["param"] == "messages"


@pytest.mark.model
def test_detokenize_takes_at_most_the_context(smollm2_server: RunningServer) -> None:
    url = smollm2_server.url
    info = httpx.post(f"{url}/tokenize", json={"prompt": "Hello world"}, timeout=30).json()
    assert info["count"] == len(info["tokens"]) > 0
    limit = info["max_model_len"]
    r = httpx.post(f"{url}/detokenize", json={"tokens": info["tokens"]}, timeout=30)
    assert r.status_code == 200 and r.json()["prompt"] == "Hello world"
    r = httpx.post(f"{url}/detokenize", json={"tokens": [28] * (limit + 1)}, timeout=30)
    err = assert_error_shape(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "tokens"
    r = httpx.post(f"{url}/detokenize", json={"tokens": [28] * limit}, timeout=30)
    assert r.status_code == 200
