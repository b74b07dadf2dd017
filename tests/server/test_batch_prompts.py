"""Several prompts in one completions request, through the official openai client and raw
HTTP: every choice equals the one the same request with that prompt alone gets (text,
logprobs, finish reason; greedy and seeded, streamed and not), choices are indexed
``prompt_index * n + i``, usage sums over the prompts, and one bad prompt is a 400 for the
whole request before anything runs."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

PROMPTS = ["once upon a time there", "the cat sat on", "a b c d e f g h"]


@pytest.fixture(scope="module")
def own_server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """This module's own server: its prefix cache stays out of other modules' counts."""
    with make_server() as srv:
        yield srv


@pytest.fixture
def client(own_server: RunningServer) -> Any:
    import openai

    return openai.OpenAI(
        base_url=f"{own_server.url}/v1", api_key="unused", timeout=60, max_retries=0
    )


def _choice(c: Any) -> dict[str, Any]:
    """What must be equal between a batched and a lone choice."""
    lp = c.logprobs
    logprobs = None
    if lp is not None:
        logprobs = (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)
    return {"text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}


def _alone(client: Any, prompts: list[Any], **body: Any) -> tuple[list[dict[str, Any]], Any]:
    """Each prompt sent by itself: its choices in order, and the usages. Each is sent once
    before, so that alone and in the batch a prompt meets the same prefix-cache pages (a
    cached page's K/V agrees with a recomputed one to ~1e-7, not bit for bit)."""
    for prompt in prompts:
        client.completions.create(model="tiny-llama", prompt=prompt, **body)
    choices, usages = [], []
    for prompt in prompts:
        out = client.completions.create(model="tiny-llama", prompt=prompt, **body)
        choices += [_choice(c) for c in sorted(out.choices, key=lambda c: c.index)]
        usages.append(out.usage)
    return choices, usages


CASES = {
    "greedy-logprobs": {"max_tokens": 6, "temperature": 0, "logprobs": 2},
    "seeded-n3": {"max_tokens": 6, "temperature": 1.0, "n": 3, "seed": 11, "logprobs": 1},
    "echo-logprobs": {"max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1},
    "best-of": {"max_tokens": 4, "temperature": 1.0, "n": 2, "best_of": 3, "seed": 5},
    "stop": {"max_tokens": 12, "temperature": 0, "stop": [" "]},
}


@pytest.mark.parametrize("case", CASES)
def test_batch_equals_each_prompt_alone(client: Any, case: str) -> None:
    body = {**CASES[case], "extra_body": {"ignore_eos": True}}
    want, usages = _alone(client, PROMPTS, **body)
    out = client.completions.create(model="tiny-llama", prompt=PROMPTS, **body)
    n = CASES[case].get("n", 1)
    assert [c.index for c in out.choices] == list(range(len(PROMPTS) * n))
    assert [_choice(c) for c in out.choices] == want
    assert out.usage.prompt_tokens == sum(u.prompt_tokens for u in usages)
    assert out.usage.completion_tokens == sum(u.completion_tokens for u in usages)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_token_id_prompts_equal_their_text(client: Any, own_server: RunningServer) -> None:
    ids = [
        httpx.post(f"{own_server.url}/tokenize", json={"prompt": t}, timeout=30).json()["tokens"]
        for t in PROMPTS
    ]
    body = {"max_tokens": 5, "temperature": 0, "logprobs": 3}
    want, _ = _alone(client, PROMPTS, **body)
    out = client.completions.create(model="tiny-llama", prompt=ids, **body)
    assert [_choice(c) for c in out.choices] == want


def _stream(srv: RunningServer, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The data events of a streamed request (without [DONE]) and its raw data lines."""
    events, lines = [], []
    url = f"{srv.url}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                if line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
    return events, lines


@pytest.mark.parametrize("case", ["greedy-logprobs", "seeded-n3", "echo-logprobs"])
def test_streamed_batch_equals_each_prompt_alone(
    client: Any, own_server: RunningServer, case: str
) -> None:
    body = {**CASES[case], "ignore_eos": True}
    want, usages = _alone(client, PROMPTS, **CASES[case], extra_body={"ignore_eos": True})
    events, lines = _stream(
        own_server,
        {**body, "prompt": PROMPTS, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert lines[-1] == "[DONE]"
    text: dict[int, str] = defaultdict(str)
    tokens: dict[int, list[Any]] = defaultdict(list)
    finish: dict[int, str] = {}
    for event in events[:-1]:
        assert len(event["choices"]) == 1  # one choice per chunk, under its index
        c = event["choices"][0]
        text[c["index"]] += c["text"]
        if c["logprobs"] is not None:
            lp = c["logprobs"]
            fields = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
            tokens[c["index"]] += zip(*(lp[f] for f in fields), strict=True)
        if c["finish_reason"] is not None:
            finish[c["index"]] = c["finish_reason"]
    n = CASES[case].get("n", 1)
    assert sorted(text) == list(range(len(PROMPTS) * n))
    for index, w in enumerate(want):
        assert text[index] == w["text"]
        assert finish[index] == w["finish_reason"]
        got = [list(t) for t in zip(*tokens[index], strict=True)]
        assert got == [list(x) for x in w["logprobs"]]
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    assert usage["prompt_tokens"] == sum(u.prompt_tokens for u in usages)
    assert usage["completion_tokens"] == sum(u.completion_tokens for u in usages)


def test_streamed_batch_through_the_openai_client(client: Any) -> None:
    body = {"max_tokens": 5, "temperature": 0}
    want, _ = _alone(client, PROMPTS, **body)
    got: dict[int, str] = defaultdict(str)
    for chunk in client.completions.create(model="tiny-llama", prompt=PROMPTS, stream=True, **body):
        for c in chunk.choices:
            got[c.index] += c.text
    assert [got[i] for i in range(len(PROMPTS))] == [w["text"] for w in want]


def test_prompts_share_pages_through_the_prefix_cache(own_server: RunningServer) -> None:
    shared = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)  # new to the cache
    prompts = [shared + " once", shared + " twice", shared + " three times"]
    ids = [
        httpx.post(f"{own_server.url}/tokenize", json={"prompt": t}, timeout=30).json()["tokens"]
        for t in prompts
    ]
    page_size = TINY_OPTIONS["page_size"]

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))

    # the first prompt computes the shared pages; each later one finds every full page of
    # the prefix it shares with an earlier prompt
    want = sum(
        max(common(ids[k], ids[j]) for j in range(k)) // page_size * page_size
        for k in range(1, len(ids))
    )
    body = {"max_tokens": 2, "temperature": 0, "prompt": prompts}
    r = httpx.post(f"{own_server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    usage = r.json()["usage"]
    assert want > 0 and usage["prompt_tokens_details"]["cached_tokens"] == want
    assert usage["prompt_tokens"] == sum(map(len, ids))


def _requests_added(srv: RunningServer) -> float:
    return sum(v for k, v in srv.metrics().items() if k.startswith("pagedattn:prompt_tokens_total"))


@pytest.mark.parametrize(
    ("prompt", "param", "says"),
    [
        (["fine", "x " * 5000], "prompt", "prompt 1"),
        ([[1, 2], [10**9]], "prompt", "prompt 1"),
        ([[1, 2], []], "prompt", "prompt 1"),
        (["a", [1, 2]], "prompt", None),
        ([[1, 2], 3], "prompt", None),
        ([], "prompt", None),
    ],
    ids=["too-long", "bad-id", "empty-ids", "mixed", "ids-and-list", "empty"],
)
def test_one_bad_prompt_refuses_the_whole_request(
    own_server: RunningServer, prompt: Any, param: str, says: str | None
) -> None:
    before = _requests_added(own_server)
    body = {"prompt": prompt, "max_tokens": 4}
    r = httpx.post(f"{own_server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    if says is not None:
        assert error["message"].startswith(says), error["message"]
    assert _requests_added(own_server) == before  # nothing ran


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_aborts_every_prompt(
    make_server: ServerFactory, long_model_dir: Path, stream: bool
) -> None:
    aborted = 'pagedattn:request_success_total{finished_reason="abort"}'
    # 8,000 tokens each: none can end before the hang-up reaches the engine, however loaded
    body = {"prompt": PROMPTS, "max_tokens": 8000, "ignore_eos": True, "stream": stream}
    with make_server(model_dir=long_model_dir, num_pages=6144) as srv:
        url = f"{srv.url}/v1/completions"
        if stream:
            with httpx.stream("POST", url, json=body, timeout=60) as r:
                assert r.status_code == 200
                next(r.iter_lines())  # the first event: the prompts run
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=0.5)
        m = srv.wait_idle()
    assert m["pagedattn:num_requests_running"] == 0
    assert m["pagedattn:num_used_pages"] == 0
    assert m[aborted] == len(PROMPTS)  # none ran to its end


@pytest.mark.parametrize("stream", [False, True])
def test_constrained_batch_equals_each_prompt_alone(client: Any, stream: bool) -> None:
    """Each prompt gets its own grammar state: the batch's outputs are the lone ones."""
    regex = "[a-e]{1,6}( [a-e]{1,6}){0,3}"
    body = {"max_tokens": 24, "temperature": 1.0, "seed": 9, "n": 2}
    extra = {"guided_regex": regex}
    want, _ = _alone(client, PROMPTS, **body, extra_body=extra)
    assert all(re.fullmatch(regex, w["text"]) for w in want)
    if not stream:
        out = client.completions.create(
            model="tiny-llama", prompt=PROMPTS, **body, extra_body=extra
        )
        assert [_choice(c) for c in out.choices] == want
        return
    got: dict[int, str] = defaultdict(str)
    for chunk in client.completions.create(
        model="tiny-llama", prompt=PROMPTS, stream=True, **body, extra_body=extra
    ):
        for c in chunk.choices:
            got[c.index] += c.text
    assert [got[i] for i in range(len(want))] == [w["text"] for w in want]
