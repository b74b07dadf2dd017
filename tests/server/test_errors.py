"""Bad input never crashes the engine or costs another request anything: each is a 4xx with
an OpenAI error body, unexpected exceptions are 500s of the same shape, and the next good
request succeeds."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

GOOD = {"prompt": "hello world", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
LONG_PROMPT = "the cat sat on the mat " * 40  # 240 tokens: fits the context, not a small pool
PAGED_PROMPT = "seven lazy frogs hop over a quiet pond " * 3  # full pages no other test uses

CASES: list[tuple[str, str, Any, int, str | None, str | None]] = [
    # (id, path, body (str = raw bytes), status, param, code)
    ("invalid-json", "/v1/completions", '{"prompt": "x",', 400, None, None),
    ("not-an-object", "/v1/completions", "[1, 2]", 400, None, None),
    ("no-body", "/v1/completions", "", 400, None, None),
    (
        "unknown-model",
        "/v1/completions",
        {**GOOD, "model": "gpt-9"},
        404,
        "model",
        "model_not_found",
    ),
    ("empty-prompt", "/v1/completions", {**GOOD, "prompt": ""}, 400, "prompt", None),
    ("empty-token-list", "/v1/completions", {**GOOD, "prompt": []}, 400, "prompt", None),
    ("token-out-of-vocab", "/v1/completions", {**GOOD, "prompt": [5, 99999]}, 400, "prompt", None),
    ("mixed-prompts", "/v1/completions", {**GOOD, "prompt": ["a", [5, 6]]}, 400, "prompt", None),
    ("max-tokens-0", "/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens", None),
    (
        "max-completion-tokens-0",
        "/v1/chat/completions",
        {**CHAT, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        None,
    ),
    ("max-tokens-negative", "/v1/completions", {**GOOD, "max_tokens": -5}, 400, "max_tokens", None),
    (
        "max-tokens-past-context",
        "/v1/completions",
        {**GOOD, "max_tokens": 100_000},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "prompt-past-context",
        "/v1/completions",
        {**GOOD, "prompt": "word " * 600},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "negative-temperature",
        "/v1/completions",
        {**GOOD, "temperature": -0.5},
        400,
        "temperature",
        None,
    ),
    ("top-p-0", "/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p", None),
    ("top-p-above-1", "/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p", None),
    ("top-k-below-minus-1", "/v1/completions", {**GOOD, "top_k": -3}, 400, "top_k", None),
    ("seed-past-int64", "/v1/completions", {**GOOD, "seed": 2**63}, 400, "seed", None),
    ("empty-stop", "/v1/completions", {**GOOD, "stop": [""]}, 400, "stop", None),
    ("n-0", "/v1/completions", {**GOOD, "n": 0}, 400, "n", None),
    ("n-129", "/v1/chat/completions", {**CHAT, "n": 129}, 400, "n", None),
    ("best-of-below-n", "/v1/completions", {**GOOD, "n": 3, "best_of": 2}, 400, "best_of", None),
    (
        "best-of-streamed",
        "/v1/completions",
        {**GOOD, "n": 1, "best_of": 2, "stream": True},
        400,
        "best_of",
        None,
    ),
    ("logprobs-21", "/v1/completions", {**GOOD, "logprobs": 21}, 400, "logprobs", None),
    (
        "bias-past-vocab",
        "/v1/completions",
        {**GOOD, "logit_bias": {"99999": 1}},
        400,
        "logit_bias",
        None,
    ),
    (
        "bias-not-an-id",
        "/v1/completions",
        {**GOOD, "logit_bias": {"x": 1}},
        400,
        "logit_bias",
        None,
    ),
    (
        "bias-101",
        "/v1/chat/completions",
        {**CHAT, "logit_bias": {"5": 101}},
        400,
        "logit_bias",
        None,
    ),
    (
        "stop-id-past-vocab",
        "/v1/completions",
        {**GOOD, "stop_token_ids": [99999]},
        400,
        "stop_token_ids",
        None,
    ),
    (
        "presence-3",
        "/v1/completions",
        {**GOOD, "presence_penalty": 3},
        400,
        "presence_penalty",
        None,
    ),
    ("min-tokens-over-max", "/v1/completions", {**GOOD, "min_tokens": 9}, 400, "min_tokens", None),
    ("max-tokens-0-no-echo", "/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens", None),
    (
        "wrong-type-max-tokens",
        "/v1/completions",
        {**GOOD, "max_tokens": "many"},
        400,
        "max_tokens",
        None,
    ),
    ("wrong-type-prompt", "/v1/completions", {**GOOD, "prompt": {"a": 1}}, 400, "prompt", None),
    ("missing-prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt", None),
    ("empty-messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", None),
    (
        "role-not-text",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": 3, "content": "a"}]},
        400,
        "messages",
        None,
    ),
    (
        "top-logprobs-without-logprobs",
        "/v1/chat/completions",
        {**CHAT, "top_logprobs": 2},
        400,
        "top_logprobs",
        None,
    ),
    (
        "top-logprobs-21",
        "/v1/chat/completions",
        {**CHAT, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        None,
    ),
]


def assert_error_shape(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    return dict(error)


@functools.cache
def clean_text(model_dir: Path) -> str:
    """GOOD's greedy text from a fresh offline engine on the model (a clean server's answer)."""
    return fresh_text(model_dir, str(GOOD["prompt"]), int(GOOD["max_tokens"]))


def assert_good_request_works(srv: RunningServer) -> None:
    """GOOD succeeds with exactly the text a clean engine gives (nothing poisoned)."""
    assert srv.model_dir is not None, "the oracle needs the server's model folder"
    r = httpx.post(f"{srv.url}/v1/completions", json=GOOD, headers=srv.headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert r.json()["choices"][0]["text"] == clean_text(srv.model_dir)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_input_is_a_4xx_and_the_next_request_succeeds(
    server: RunningServer,
    path: str,
    body: Any,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    url = server.url + path
    if isinstance(body, str):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(url, json=body, timeout=60)
    error = assert_error_shape(r, status)
    assert error["param"] == param
    assert error["code"] == code
    if status == 400:
        assert error["type"] == "invalid_request_error"
    assert_good_request_works(server)


def test_streaming_bad_input_is_a_4xx_before_any_event(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={**GOOD, "stream": True, "top_p": 0})
    assert_error_shape(r, 400)
    assert_good_request_works(server)


def test_unknown_route_and_method_have_the_error_shape(server: RunningServer) -> None:
    assert_error_shape(httpx.get(f"{server.url}/v1/nothing"), 404)
    assert_error_shape(httpx.get(f"{server.url}/v1/completions"), 405)


def test_prompt_larger_than_the_kv_pool(make_server: ServerFactory) -> None:
    with make_server(num_pages=8) as srv:  # 8 pages of 4 tokens
        for path, body in [
            ("/v1/completions", {**GOOD, "prompt": LONG_PROMPT}),
            ("/v1/completions", {**GOOD, "prompt": LONG_PROMPT, "stream": True}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_PROMPT}]}),
        ]:
            r = httpx.post(srv.url + path, json=body, timeout=60)
            assert assert_error_shape(r, 400)["code"] == "cache_capacity_exceeded"
        # a max_tokens the pool cannot hold is refused; without max_tokens it is shrunk to fit
        r = httpx.post(f"{srv.url}/v1/completions", json={**GOOD, "max_tokens": 40}, timeout=60)
        assert assert_error_shape(r, 400)["code"] == "cache_capacity_exceeded"
        body = {**CHAT, "max_tokens": None, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 8 * 4 + 1
        assert_good_request_works(srv)


def fresh_text(model_dir: Path, prompt: str, max_tokens: int) -> str:
    """The greedy completion of a fresh offline engine on the same model (the oracle)."""
    from pagedattn import LLM, SamplingParams

    llm = LLM(model=str(model_dir), **TINY_OPTIONS)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return str(llm.generate([prompt], params)[0].outputs[0].text)


def test_unexpected_exceptions_are_500s_and_the_engine_keeps_serving(
    server: RunningServer, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.app.state.async_engine.engine

    def broken_template(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("template exploded")

    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", broken_template)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60)
    error = assert_error_shape(r, 500)
    assert "template exploded" in error["message"]
    monkeypatch.undo()

    calls = {"n": 0}
    real_run = engine.runner.run

    def run_failing_once(batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("kernel exploded")
        return real_run(batch)

    monkeypatch.setattr(engine.runner, "run", run_failing_once)
    body = {**GOOD, "prompt": PAGED_PROMPT, "max_tokens": 6}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    error = assert_error_shape(r, 500)
    assert "kernel exploded" in error["message"] and error["code"] == "engine_error"
    # the same prompt again: the answer a fresh engine gives, and none of the pages the
    # failed step reserved is served from the prefix cache
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == fresh_text(tiny_model_dir, PAGED_PROMPT, 6)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert server.wait_idle()["pagedattn:num_used_pages"] == 0
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
