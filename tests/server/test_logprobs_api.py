"""logprobs, echo, n / best_of, penalties and logit_bias over HTTP, parsed by the official
``openai`` client, streamed and not; values equal the in-process engine's (itself checked
against a dense forward and HF transformers in tests/engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

PROMPT = "once upon a time there"
MESSAGES = [{"role": "user", "content": "the cat sat on the mat"}]


@pytest.fixture(scope="module")
def own_server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """A server of this module's own: its prefix cache stays out of other modules' counts."""
    with make_server() as srv:
        yield srv


@pytest.fixture
def client(own_server: RunningServer) -> Any:
    import openai

    return openai.OpenAI(
        base_url=f"{own_server.url}/v1", api_key="unused", timeout=60, max_retries=0
    )


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), **TINY_OPTIONS)


def _engine(llm: LLM, prompt: Any, **params: Any) -> Any:
    params = {"temperature": 0.0, "ignore_eos": True, **params}
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return llm.chat([prompt], SamplingParams(**params), use_tqdm=False)[0]
    return llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0]


def _text(llm: LLM, token_id: int) -> str:
    return str(llm.engine.tokenizer.decode([token_id]))


def _expected_completion_logprobs(llm: LLM, ids: list[int], positions: list[Any], n: int) -> Any:
    tokens = [_text(llm, t) for t in ids]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    lps = [None if p is None else p[t].logprob for t, p in zip(ids, positions, strict=True)]
    # OpenAI's legacy shape (and vLLM's): the token itself, then the alternatives ranked 1..n
    tops = [
        None
        if p is None
        else {v.decoded_token: v.logprob for k, v in p.items() if k == t or v.rank <= n}
        for t, p in zip(ids, positions, strict=True)
    ]
    return tokens, lps, tops, offsets


def test_completion_logprobs_shape_and_values(client: Any, llm: LLM) -> None:
    want = _engine(llm, PROMPT, max_tokens=5, logprobs=3).outputs[0]
    out = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = out.choices[0].logprobs
    tokens, lps, tops, offsets = _expected_completion_logprobs(
        llm, want.token_ids, want.logprobs, 3
    )
    assert lp.tokens == tokens and lp.text_offset == offsets
    assert lp.token_logprobs == pytest.approx(lps, abs=1e-6)
    assert [set(t) for t in lp.top_logprobs] == [set(t) for t in tops]
    assert all(len(t) <= 4 for t in lp.top_logprobs)
    for got, exp in zip(lp.top_logprobs, tops, strict=True):
        assert got == pytest.approx(exp, abs=1e-6)


def test_echo_logprobs_with_token_id_prompt_as_lm_eval_sends(client: Any, llm: LLM) -> None:
    ids = llm.engine.tokenizer.encode(PROMPT)
    want = _engine(llm, ids, max_tokens=1, logprobs=1, prompt_logprobs=1)
    # lm-evaluation-harness local-completions: echo, logprobs 1, max_tokens 1, token ids.
    out = client.completions.create(
        model="tiny-llama", prompt=[ids], max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    choice = out.choices[0]
    all_ids = ids + want.outputs[0].token_ids
    positions = [*want.prompt_logprobs, *want.outputs[0].logprobs]
    tokens, lps, tops, offsets = _expected_completion_logprobs(llm, all_ids, positions, 1)
    assert choice.text == llm.engine.tokenizer.decode(ids) + want.outputs[0].text
    assert choice.logprobs.tokens == tokens and choice.logprobs.text_offset == offsets
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs == pytest.approx(lps, abs=1e-6)
    assert [t and set(t) for t in choice.logprobs.top_logprobs] == [t and set(t) for t in tops]
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 1
    # max_tokens 0: only the prompt, with its logprobs
    zero = client.completions.create(
        model="tiny-llama", prompt=ids, max_tokens=0, logprobs=2, echo=True
    )
    assert zero.choices[0].text == llm.engine.tokenizer.decode(ids)
    assert zero.choices[0].logprobs.token_logprobs == pytest.approx(lps[:-1], abs=1e-6)
    assert zero.choices[0].finish_reason == "length" and zero.usage.completion_tokens == 0
    # echo without logprobs: the prompt text, no logprobs
    plain = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=2,
        echo=True,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None


def test_streamed_completion_chunks_carry_their_logprobs(client: Any, llm: LLM) -> None:
    whole = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=2,
        echo=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(
        client.completions.create(
            model="tiny-llama",
            prompt=PROMPT,
            max_tokens=6,
            temperature=0,
            logprobs=2,
            echo=True,
            extra_body={"ignore_eos": True},
            stream=True,
        )
    )
    tokens, lps, offsets = [], [], []
    for ch in chunks:
        lp = ch.choices[0].logprobs
        if lp is not None:
            tokens += lp.tokens
            lps += lp.token_logprobs
            offsets += lp.text_offset
    w = whole.choices[0].logprobs
    assert tokens == w.tokens and offsets == w.text_offset
    assert lps == pytest.approx(w.token_logprobs, abs=1e-9)
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_logprobs_and_top_logprobs_streamed_and_not(client: Any, llm: LLM) -> None:
    want = _engine(llm, MESSAGES, max_tokens=5, logprobs=2).outputs[0]
    out = client.chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = out.choices[0].logprobs.content
    assert [c.token for c in content] == [_text(llm, t) for t in want.token_ids]
    for c, t, pos in zip(content, want.token_ids, want.logprobs, strict=True):
        assert c.logprob == pytest.approx(pos[t].logprob, abs=1e-6)
        assert c.bytes == list(c.token.encode())
        top = sorted((v.rank, v.decoded_token, v.logprob) for v in pos.values() if v.rank <= 2)
        assert [x.token for x in c.top_logprobs] == [x[1] for x in top]
        assert [x.logprob for x in c.top_logprobs] == pytest.approx([x[2] for x in top])
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            extra_body={"ignore_eos": True},
            stream=True,
        )
    )
    streamed = [
        c
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for c in ch.choices[0].logprobs.content
    ]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_n_choices_equal_solo_requests_seeded_seed_plus_i(client: Any, llm: LLM) -> None:
    kwargs = {"max_tokens": 6, "temperature": 1.0, "seed": 7}
    out = client.completions.create(
        model="tiny-llama", prompt=PROMPT, n=3, **kwargs, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [
        _engine(llm, PROMPT, max_tokens=6, temperature=1.0, seed=7 + i).outputs[0].text
        for i in range(3)
    ]
    assert [c.text for c in out.choices] == texts
    assert out.usage.completion_tokens == 18
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,
            n=2,
            stream=True,
            **kwargs,
            extra_body={"ignore_eos": True},
        )
    )
    joined = {0: "", 1: ""}
    for ch in chunks:
        for c in ch.choices:
            joined[c.index] += c.delta.content or ""
    chat = [
        _engine(llm, MESSAGES, max_tokens=6, temperature=1.0, seed=7 + i).outputs[0].text
        for i in range(2)
    ]
    assert [joined[0], joined[1]] == chat
    best = client.completions.create(
        model="tiny-llama", prompt=PROMPT, n=1, best_of=3, **kwargs, extra_body={"ignore_eos": True}
    )
    assert len(best.choices) == 1 and best.choices[0].text in texts


def test_penalties_and_logit_bias_change_the_output_like_the_engine(client: Any, llm: LLM) -> None:
    fields = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    extra = {"repetition_penalty": 1.3, "min_p": 0.1, "ignore_eos": True}
    out = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, **fields, extra_body=extra
    )
    want = _engine(llm, PROMPT, max_tokens=8, **fields, **extra)
    assert out.choices[0].text == want.outputs[0].text
    assert out.choices[0].text != _engine(llm, PROMPT, max_tokens=8).outputs[0].text
    forced = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=3,
        temperature=0,
        logit_bias={"70": 100},
        extra_body={"ignore_eos": True},
    )
    assert forced.choices[0].text == _text(llm, 70) * 3
    stop = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logit_bias={"70": 100},
        extra_body={"stop_token_ids": [70]},
    )
    assert stop.choices[0].finish_reason == "stop" and stop.choices[0].text == ""


def test_special_token_stop_string_and_special_token_text_over_http(client: Any) -> None:
    forced = {"1": 100}  # <|im_start|> (tests/model/tiny.py SPECIALS) becomes the greedy pick
    base = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    stopped = client.completions.create(**base, stop="<|im_start|>", logit_bias=forced)
    assert stopped.choices[0].text == "" and stopped.choices[0].finish_reason == "stop"
    kept = client.completions.create(
        **base,
        stop="<|im_start|>",
        logit_bias=forced,
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == "<|im_start|>" and kept.usage.completion_tokens == 1
    shown = client.completions.create(
        **base, logit_bias=forced, extra_body={"skip_special_tokens": False}
    )
    assert shown.choices[0].text == "<|im_start|><|im_start|>"
    hidden = client.completions.create(**base, logit_bias=forced)
    assert hidden.choices[0].text == "" and hidden.choices[0].finish_reason == "length"
