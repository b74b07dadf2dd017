"""``tool_choice: "auto"`` through ``/v1/responses`` (the official openai client's
``responses.create``): the model's own Hermes-style call comes back as a ``function_call``
output item whose arguments validate (jsonschema) against the tool's schema.

The Responses API has no ``logit_bias``, so the model itself is made to open a call: a tiny
Hermes-template model with an untied output matrix whose ``<tool_call>`` row is 4 times the
row of the token greedy decoding writes first (found with the in-process engine on the prompt
the server renders), so that token's logit is outdone and the reply starts with the tag."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from safetensors.numpy import load_file, save_file

from pagedattn.engine.llm import LLM
from pagedattn.model.tokenizer import Tokenizer
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.app import build_app
from tests.server.conftest import TINY_OPTIONS, RunningServer, serve_app
from tests.server.tiny_folder import write_tiny_folder
from tests.server.tool_templates import HERMES_TEMPLATE

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CLOCK = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER},
    {"type": "function", "name": "get_time", "parameters": CLOCK},
]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
    for t in TOOLS
]
ASK = "what is the weather in paris?"


def _first_greedy_token(folder: Path) -> int:
    with serve_app(build_app(str(folder), **TINY_OPTIONS)) as srv:
        body = {"messages": [{"role": "user", "content": ASK}], "tools": CHAT_TOOLS}
        r = httpx.post(f"{srv.url}/tokenize", json=body, timeout=60)
        assert r.status_code == 200, r.text
        prompt = [int(t) for t in r.json()["tokens"]]
    with LLM(str(folder), **TINY_OPTIONS) as llm:
        out = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0))
    (token,) = out[0].outputs[0].token_ids
    return int(token)


@pytest.fixture(scope="module")
def calling_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_tiny_folder(
        tmp_path_factory.mktemp("calling") / "tiny-hermes",
        added_tokens=("<tool_call>", "</tool_call>"),
        chat_template=HERMES_TEMPLATE,
        context=2048,
    )
    first = _first_greedy_token(folder)
    (tag,) = Tokenizer.from_folder(folder).encode("<tool_call>", add_special_tokens=False)
    assert first != tag
    weights = load_file(str(folder / "model.safetensors"))
    head = weights["model.embed_tokens.weight"].copy()
    head[tag] = 4.0 * head[first]
    save_file({**weights, "lm_head.weight": head}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return folder


@pytest.fixture(scope="module")
def calling(calling_dir: Path) -> Iterator[RunningServer]:
    with serve_app(build_app(str(calling_dir), **TINY_OPTIONS)) as srv:
        yield srv


def test_auto_call_is_a_function_call_item_that_validates(calling: RunningServer) -> None:
    import openai

    client: Any = openai.OpenAI(
        base_url=f"{calling.url}/v1", api_key="unused", timeout=120, max_retries=0
    )
    out = client.responses.create(
        model="tiny-hermes",
        input=ASK,
        tools=TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=120,
    )
    assert out.status == "completed", out
    calls = [o for o in out.output if o.type == "function_call"]
    assert len(calls) == 1, out.output
    (call,) = calls
    assert call.name in SCHEMAS and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    # the chat route gives the same call for the same conversation
    chat = client.chat.completions.create(
        model="tiny-hermes",
        messages=[{"role": "user", "content": ASK}],
        tools=CHAT_TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
    )
    (chat_call,) = chat.choices[0].message.tool_calls
    assert (chat_call.function.name, chat_call.function.arguments) == (call.name, call.arguments)
