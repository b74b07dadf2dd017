"""vLLM's tokenizer routes, chat-template request fields, several served names, and the request
field audit (unknown or unserved fields are 400s naming them, informational ones are accepted).
HF transformers' tokenizer and ``apply_chat_template`` on the same files are the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.model.tiny import CHAT_TEMPLATE
from tests.server.conftest import RunningServer, ServerFactory

transformers = pytest.importorskip("transformers")

CONVO = [
    {"role": "user", "content": "the cat sat"},
    {"role": "assistant", "content": "on the mat "},
]


@pytest.fixture(scope="module")
def server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """This module's own tiny-model server: the session server's prefix cache, which other
    modules' cached-token counts depend on, stays untouched."""
    with make_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tiny_model_dir / "tokenizer.json"),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
    )


def post(srv: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, headers=srv.headers, timeout=60)


def test_tokenize_prompt_equals_hf(server: RunningServer, hf_tokenizer: Any) -> None:
    text = "once upon a time<|im_end|> there"
    r = post(server, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = hf_tokenizer(text)["input_ids"]
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(ids)
    assert body["max_model_len"] == 512
    r = post(server, "/detokenize", {"tokens": ids})
    assert r.json() == {"prompt": hf_tokenizer.decode(ids)}
    assert post(server, "/detokenize", {"tokens": [10**6]}).json()["error"]["param"] == "tokens"


@pytest.mark.parametrize(
    ("options", "hf_options"),
    [
        ({}, {"add_generation_prompt": True}),
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        (
            {"add_generation_prompt": False, "continue_final_message": True},
            {"continue_final_message": True},
        ),
    ],
)
def test_tokenize_messages_equals_hf_chat_template(
    server: RunningServer, hf_tokenizer: Any, options: dict[str, Any], hf_options: dict[str, Any]
) -> None:
    r = post(server, "/tokenize", {"messages": CONVO, **options})
    assert r.status_code == 200, r.text
    text = hf_tokenizer.apply_chat_template(CONVO, tokenize=False, **hf_options)
    assert r.json()["tokens"] == hf_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_continue_final_message_continues_the_assistant_text(
    server: RunningServer, hf_tokenizer: Any
) -> None:
    # the oracle: a raw completion on the prompt HF renders for the same conversation
    prompt = hf_tokenizer.apply_chat_template(CONVO, tokenize=False, continue_final_message=True)
    assert prompt.endswith("on the mat ")
    ids = hf_tokenizer(prompt)["input_ids"]
    common = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    raw = post(server, "/v1/completions", {"prompt": ids, **common}).json()
    chat = post(
        server,
        "/v1/chat/completions",
        {
            "messages": CONVO,
            "add_generation_prompt": False,
            "continue_final_message": True,
            **common,
        },
    ).json()
    assert chat["choices"][0]["message"]["content"] == raw["choices"][0]["text"]
    assert chat["usage"]["prompt_tokens"] == len(ids)


def test_chat_template_and_kwargs_per_request(server: RunningServer, hf_tokenizer: Any) -> None:
    template = "{% for m in messages %}[{{ m.role }}|{{ greeting }}] {{ m.content }}{% endfor %}"
    kwargs = {"greeting": "hey"}
    expected = hf_tokenizer.apply_chat_template(
        CONVO[:1], tokenize=False, chat_template=template, add_generation_prompt=True, **kwargs
    )
    assert expected == "[user|hey] the cat sat"
    ids = hf_tokenizer(expected)["input_ids"]
    body = {"messages": CONVO[:1], "chat_template": template, "chat_template_kwargs": kwargs}
    assert post(server, "/tokenize", body).json()["tokens"] == ids
    common = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    chat = post(server, "/v1/chat/completions", {**body, **common}).json()
    raw = post(server, "/v1/completions", {"prompt": ids, **common}).json()
    assert chat["choices"][0]["message"]["content"] == raw["choices"][0]["text"]
    assert chat["usage"]["prompt_tokens"] == len(ids)


def test_tokenizer_info_and_version(server: RunningServer) -> None:
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|im_start|>"
    assert info["chat_template"] == CHAT_TEMPLATE
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert httpx.get(f"{server.url}/version", timeout=10).json() == {
        "version": version("pagedattn")
    }


MSG = [{"role": "user", "content": "hi"}]
REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "both-generation-flags",
        "/v1/chat/completions",
        {"messages": MSG, "continue_final_message": True},
        "continue_final_message",
    ),
    (
        "tools-auto-without-a-template-tool-format",
        "/v1/chat/completions",
        {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]},
        "tool_choice",
    ),
    (
        "tool-choice-no-tools",
        "/v1/chat/completions",
        {"messages": MSG, "tool_choice": "auto"},
        "tool_choice",
    ),
    (
        "functions",
        "/v1/chat/completions",
        {"messages": MSG, "functions": [{"name": "f"}]},
        "functions",
    ),
    (
        "audio-modality",
        "/v1/chat/completions",
        {"messages": MSG, "modalities": ["text", "audio"]},
        "modalities",
    ),
    (
        "unknown-field",
        "/v1/chat/completions",
        {"messages": MSG, "prediction": {"type": "content", "content": "x"}},
        "prediction",
    ),
    (
        "reserved-template-kwarg",
        "/v1/chat/completions",
        {"messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}},
        "chat_template_kwargs",
    ),
    ("suffix", "/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix"),
    (
        "unknown-completion-field",
        "/v1/completions",
        {"prompt": "a", "frequency_penaltyy": 1.0},
        "frequency_penaltyy",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_unserved_fields_are_400_naming_them(
    server: RunningServer, path: str, body: dict[str, Any], param: str
) -> None:
    r = post(server, path, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_informational_fields_and_tool_choice_none_are_accepted(server: RunningServer) -> None:
    common = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = post(server, "/v1/chat/completions", {"messages": MSG, **common}).json()
    extra = {
        "user": "u1",
        "metadata": {"k": "v"},
        "store": False,
        "service_tier": "auto",
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "modalities": ["text"],
    }
    r = post(server, "/v1/chat/completions", {"messages": MSG, **common, **extra})
    assert r.status_code == 200, r.text
    # the tiny template does not render tools: the same prompt, the same answer
    assert r.json()["choices"] == plain["choices"]


@pytest.fixture(scope="module")
def aliased(make_server: ServerFactory) -> Iterator[RunningServer]:
    with make_server(served_model_name=["main-name", "alias"]) as srv:
        yield srv


def test_several_served_names(aliased: RunningServer) -> None:
    ids = [m["id"] for m in httpx.get(f"{aliased.url}/v1/models", timeout=10).json()["data"]]
    assert ids == ["main-name", "alias"]
    body = {"prompt": "a", "max_tokens": 2, "temperature": 0}
    for name in ids:
        r = post(aliased, "/v1/completions", {**body, "model": name})
        assert r.status_code == 200 and r.json()["model"] == name
    assert post(aliased, "/v1/completions", body).json()["model"] == "main-name"
    assert post(aliased, "/v1/completions", {**body, "model": "tiny-llama"}).status_code == 404
    assert post(aliased, "/tokenize", {"prompt": "a", "model": "alias"}).status_code == 200


def test_deploy_readme_lists_every_request_field() -> None:
    from pagedattn.server import protocol as p
    from pagedattn.server.responses_api import ResponsesRequest
    from pagedattn.server.structured_outputs import StructuredOutputs

    readme = (Path(__file__).resolve().parents[2] / "deploy" / "README.md").read_text()
    table = readme[readme.index("### Request fields") : readme.index("### Structured output")]
    for model in (p.CompletionRequest, p.ChatCompletionRequest, StructuredOutputs):
        for name, info in model.model_fields.items():
            assert f"`{info.alias or name}`" in table, name
    responses = readme[readme.index("### Responses API") : readme.index("### Structured output")]
    for name in ResponsesRequest.model_fields:
        assert f"`{name}`" in responses, name
