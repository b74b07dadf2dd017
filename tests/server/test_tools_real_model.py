"""Tool calling on the embedded SmolLM2-135M-Instruct through the openai client: a forced call
reads the city from the question, the tool's result reaches the final answer, and under
"auto" (with a Hermes-style chat_template: SmolLM2's own writes no tool calls) the lazy
grammar leaves a reply that opens no call exactly as unconstrained decoding writes it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from pagedattn.server.app import build_app
from tests.server.conftest import RunningServer, serve_app
from tests.server.tool_templates import HERMES_TEMPLATE

MODEL = "SmolLM2-135M-Instruct"
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": PARAMS,
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def smollm2() -> Iterator[RunningServer]:
    with serve_app(build_app(None, kv_cache_mib=64)) as srv:
        yield srv


def client_of(srv: RunningServer) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", timeout=300, max_retries=0)


@pytest.mark.model
def test_smollm2_tool_loop(smollm2: RunningServer) -> None:
    import openai

    client = client_of(smollm2)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER])
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    first = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    c = first.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS)
    assert call.function.name == "get_weather" and args == {"city": "Paris"}
    result = {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees Celsius"}
    final = client.chat.completions.create(
        model=MODEL,
        messages=[*QUESTION, c.message, result],
        tools=[WEATHER],
        temperature=0,
        max_tokens=40,
        extra_body={"chat_template": HERMES_TEMPLATE},
    )
    f = final.choices[0]
    assert f.message.tool_calls is None and f.finish_reason == "stop"
    assert "21" in (f.message.content or "")


@pytest.mark.model
def test_smollm2_auto_without_a_call_is_unconstrained_text(smollm2: RunningServer) -> None:
    client = client_of(smollm2)
    texts = []
    for choice in ("auto", "none"):
        out = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=choice,
            temperature=0,
            max_tokens=40,
            extra_body={"chat_template": HERMES_TEMPLATE},
        )
        assert out.choices[0].message.tool_calls is None
        texts.append(out.choices[0].message.content)
    assert texts[0] == texts[1] and "Paris" in (texts[0] or "")
