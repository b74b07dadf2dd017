"""vLLM parity on the embedded SmolLM2, driven as vLLM's own entrypoint tests drive its server:
a real `pagedattn serve`, the official `openai` client (vLLM's fields in `extra_body`), usage
counted by an independent tokenizer (transformers loading the model's GGUF tokenizer),
streamed and non-streamed texts equal, logprob list shapes, token ids, continuous usage,
custom roles, int64 seeds, `/invocations` and `/load`."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import serve_subprocess

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    args = ["--kv-cache-mib", "64", "--log-level", "warning", "--enable-server-load-tracking"]
    args += ["--max-logprobs", "-1"]  # -1 in a request may ask for the whole vocabulary
    with serve_subprocess(args, timeout=180) as base:
        yield base


@pytest.fixture(scope="module")
def hf_tok() -> Any:
    """The model's tokenizer as transformers reads it from the GGUF file (not our loader)."""
    from transformers import AutoTokenizer

    from pagedattn.model.registry import embedded_model_path

    path = embedded_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def _chat_ids(hf_tok: Any, messages: list[dict[str, str]]) -> list[int]:
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(hf_tok.encode(text, add_special_tokens=False))


def test_completion_usage_token_ids_and_stream_equal(client: Any, hf_tok: Any) -> None:
    want_prompt = list(hf_tok.encode(PROMPT))
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = out.choices[0]
    assert choice.prompt_token_ids == want_prompt
    assert len(choice.token_ids) == 8 and hf_tok.decode(choice.token_ids) == choice.text
    assert out.usage.prompt_tokens == len(want_prompt)
    assert out.usage.completion_tokens == 8 and out.usage.total_tokens == len(want_prompt) + 8
    # without the field: no token ids at all
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert plain.choices[0].model_dump().get("token_ids") is None
    assert plain.choices[0].model_dump().get("prompt_token_ids") is None

    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)  # usage on every chunk
    body = [c for c in chunks if c.choices]
    assert body[0].choices[0].prompt_token_ids == want_prompt
    assert all(c.choices[0].model_dump().get("prompt_token_ids") is None for c in body[1:])
    ids: list[int] = []
    for c in body:
        ids += c.choices[0].token_ids
        assert c.usage.prompt_tokens == len(want_prompt)
        assert c.usage.completion_tokens == len(ids)  # the usage so far
    assert ids == choice.token_ids
    assert "".join(c.choices[0].text for c in body) == choice.text
    # OpenAI's shape: the finish reason on its own (last) choice chunk, then the usage chunk
    assert [c.choices[0].finish_reason for c in body] == [None] * (len(body) - 1) + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chat_usage_token_ids_and_stream_equal(client: Any, hf_tok: Any) -> None:
    want_prompt = _chat_ids(hf_tok, MESSAGES)
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert out.prompt_token_ids == want_prompt  # top level for chat (vLLM's placement)
    assert out.usage.prompt_tokens == len(want_prompt)
    token_ids = out.choices[0].token_ids
    assert out.usage.completion_tokens == len(token_ids)
    assert hf_tok.decode(token_ids, skip_special_tokens=True) == out.choices[0].message.content

    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].prompt_token_ids == want_prompt
    assert all("prompt_token_ids" not in c.model_dump() for c in chunks[1:])
    assert chunks[0].usage.completion_tokens == 0 and all(c.usage for c in chunks)
    streamed_ids: list[int] = []
    text = ""
    for c in chunks:
        if c.choices:
            streamed_ids += c.choices[0].model_dump().get("token_ids") or []
            text += c.choices[0].delta.content or ""
            assert c.usage.completion_tokens == len(streamed_ids)
    assert streamed_ids == token_ids and text == out.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == out.usage.total_tokens


@pytest.mark.parametrize("num", [0, 3])
def test_completion_logprobs_list_the_sampled_token(client: Any, num: int) -> None:
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=1.0, seed=11, logprobs=num
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for token, own, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == pytest.approx(own)  # the sampled token is always listed
        assert num <= len(top) <= num + 1 and (num or len(top) == 1)


def test_chat_logprob_shapes_streamed_and_not(client: Any) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6}
    kwargs.update(temperature=0, logprobs=True, top_logprobs=4)
    out = client.chat.completions.create(**kwargs)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(t.top_logprobs) == 4 for t in content)
    streamed = [
        t
        for c in client.chat.completions.create(**kwargs, stream=True)
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_top_logprobs_minus_one_is_the_whole_vocabulary(client: Any, hf_tok: Any) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True, top_logprobs=-1
    )
    [token] = out.choices[0].logprobs.content
    assert len(token.top_logprobs) == len(hf_tok)
    assert math.fsum(math.exp(t.logprob) for t in token.top_logprobs) == pytest.approx(1, 1e-6)
    assert token.top_logprobs[0].token == token.token  # greedy: the most likely one


def test_custom_role_reaches_the_template(client: Any, hf_tok: Any) -> None:
    messages = [{"role": "narrator", "content": "A quiet night."}, *MESSAGES]
    out = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=3,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert out.prompt_token_ids == _chat_ids(hf_tok, messages)
    assert "<|im_start|>narrator" in hf_tok.decode(out.prompt_token_ids)


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1])
def test_int64_seeds_repeat(client: Any, seed: int) -> None:
    def text() -> str:
        out = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=seed
        )
        return str(out.choices[0].text)

    assert text() == text()


def test_invocations_answer_as_the_routes(url: str) -> None:
    chat = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    comp = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    a = httpx.post(f"{url}/invocations", json=chat, timeout=60).json()
    b = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
    assert a["object"] == "chat.completion"
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    c = httpx.post(f"{url}/invocations", json=comp, timeout=60).json()
    d = httpx.post(f"{url}/v1/completions", json=comp, timeout=60).json()
    assert c["object"] == "text_completion" and c["choices"][0]["text"] == d["choices"][0]["text"]
    bad = httpx.post(f"{url}/invocations", json={"max_tokens": 5}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    typo = httpx.post(f"{url}/invocations", json={**chat, "messages": 3}, timeout=60)
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "messages"


def test_load_counts_requests_in_flight(url: str) -> None:
    assert httpx.get(f"{url}/load", timeout=10).json() == {"server_load": 0}
    body = {"prompt": PROMPT, "max_tokens": 60, "stream": True, "ignore_eos": True}
    seen: list[int] = []
    started = threading.Event()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and not started.is_set():
                started.set()
                seen.append(httpx.get(f"{url}/load", timeout=10).json()["server_load"])
    assert seen == [1]
    assert httpx.get(f"{url}/load", timeout=10).json() == {"server_load": 0}
