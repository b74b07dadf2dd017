"""The official ``openai`` client against a live server on the tiny model: chat and
completions, streamed and not, stop strings, seeds, usage numbers, model listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from tests.server.conftest import TINY_OPTIONS, RunningServer

PROMPT = "once upon a time there"
MESSAGES = [{"role": "user", "content": "the cat sat on the mat"}]
GREEDY_EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    """An in-process engine on the same folder: the expected outputs."""
    return LLM(str(tiny_model_dir), **TINY_OPTIONS)


def solo(llm: LLM, prompt: Any, **params: Any) -> Any:
    params = {"temperature": 0.0, "ignore_eos": True, **params}
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return llm.chat([prompt], SamplingParams(**params), use_tqdm=False)[0]
    return llm.generate(prompt, SamplingParams(**params), use_tqdm=False)[0]


def test_models_lists_the_served_folder(client: Any, server: RunningServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]


def test_completion_equals_the_engine_and_reports_usage(client: Any, llm: LLM) -> None:
    expected = solo(llm, PROMPT, max_tokens=9)
    out = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=9, temperature=0, extra_body=GREEDY_EXTRA
    )
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.model == "tiny-llama" and out.created > 0
    assert out.choices[0].text == expected.outputs[0].text
    assert out.choices[0].finish_reason == "length"
    tokenizer = llm.engine.tokenizer
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT)) == 14
    assert out.usage.completion_tokens == 9
    assert out.usage.total_tokens == 23


def test_chat_equals_the_engine_and_repeated_prompt_is_cached(client: Any, llm: LLM) -> None:
    messages = [{"role": "user", "content": "a fresh question about caching"}]
    expected = solo(llm, messages, max_tokens=6)
    num_prompt = len(llm.engine.tokenizer.encode_chat(messages))
    first = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_completion_tokens=6,
        temperature=0,
        extra_body=GREEDY_EXTRA,
    )
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].message.content == expected.outputs[0].text
    assert first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens == num_prompt
    assert first.usage.completion_tokens == 6
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=6, temperature=0, extra_body=GREEDY_EXTRA
    )
    assert again.choices[0].message.content == expected.outputs[0].text
    # every full page (4 tokens) of the prompt but the one holding its last token is reused
    assert again.usage.prompt_tokens_details.cached_tokens == (num_prompt - 1) // 4 * 4
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_streamed_completion_joins_to_the_same_text(client: Any, llm: LLM) -> None:
    expected = solo(llm, PROMPT, max_tokens=12)
    stream = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY_EXTRA,
    )
    chunks = list(stream)
    assert len(chunks) >= 3
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.outputs[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_chat_has_role_first_and_no_usage_unless_asked(client: Any, llm: LLM) -> None:
    expected = solo(llm, MESSAGES, max_tokens=7)
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=7,
        temperature=0,
        stream=True,
        extra_body=GREEDY_EXTRA,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(client: Any, llm: LLM, stream: bool) -> None:
    full = solo(llm, PROMPT, max_tokens=20).outputs[0].text
    assert full.startswith("req_")  # the tiny model's greedy continuation
    kwargs: dict[str, Any] = {
        "model": "tiny-llama",
        "prompt": PROMPT,
        "max_tokens": 20,
        "temperature": 0,
        "stop": ["zz", "_"],
        "stream": stream,
    }
    if stream:
        chunks = list(client.completions.create(**kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert (text, reason) == ("req", "stop")
    single = client.completions.create(**{**kwargs, "stream": False, "stop": "zzz"})
    assert single.choices[0].text == full and single.choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(client: Any, llm: LLM) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny-llama",
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 1.0,
        "top_p": 0.95,
        "extra_body": {"top_k": 50, "ignore_eos": True},
    }
    a = client.completions.create(seed=1234, **kwargs).choices[0].text
    b = client.completions.create(seed=1234, **kwargs).choices[0].text
    expected = solo(llm, PROMPT, max_tokens=16, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    assert a == b == expected.outputs[0].text
    others = {client.completions.create(seed=s, **kwargs).choices[0].text for s in range(4)}
    assert len(others) > 1  # the seed matters


def test_token_id_prompt_and_user_field(client: Any, llm: LLM) -> None:
    ids = llm.engine.tokenizer.encode(PROMPT)
    out = client.completions.create(
        model="tiny-llama",
        prompt=ids,
        max_tokens=5,
        temperature=0,
        user="someone",
        extra_body=GREEDY_EXTRA,
    )
    assert out.choices[0].text == solo(llm, PROMPT, max_tokens=5).outputs[0].text
    assert out.usage.prompt_tokens == len(ids)


def chunk_line(chunk_id: str, created: int, index: int, text: str) -> str:
    """A text-only chat delta event as OpenAI spells it, written out by hand."""
    return (
        f'data: {{"id":"{chunk_id}","object":"chat.completion.chunk","created":{created},'
        f'"model":"tiny-llama","choices":[{{"index":{index},"delta":{{"content":'
        f'{json.dumps(text)}}},"logprobs":null,"finish_reason":null}}],"usage":null,'
        '"system_fingerprint":null}'
    )


def test_streamed_chat_text_events_are_openai_chunks_byte_for_byte(
    server: RunningServer, llm: LLM
) -> None:
    expected = solo(llm, MESSAGES, max_tokens=8)
    body = {
        "model": "tiny-llama",
        "messages": MESSAGES,
        "max_tokens": 8,
        "n": 2,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    texts: dict[int, str] = {0: "", 1: ""}
    content_events = 0
    url = f"{server.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            choice = event["choices"][0] if event["choices"] else None
            if choice is None or set(choice["delta"]) != {"content"} or choice["finish_reason"]:
                continue
            index, text = choice["index"], choice["delta"]["content"]
            if text:
                content_events += 1
                assert line == chunk_line(event["id"], event["created"], index, text)
            texts[index] += text
    assert content_events >= 2
    assert texts[0] == texts[1] == expected.outputs[0].text
