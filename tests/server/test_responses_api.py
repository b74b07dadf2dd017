"""``/v1/responses`` through the official openai client (``client.responses.create``): the
reply equals the chat completion of the same conversation (text, token counts, cut by
``max_output_tokens`` = incomplete), streamed as the Responses API's events, structured by
``text.format``; what is not served is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import RunningServer, ServerFactory

IMAGE = {"type": "input_image", "image_url": "x"}
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def own_server(make_server: ServerFactory) -> Iterator[RunningServer]:
    with make_server() as srv:
        yield srv


@pytest.fixture
def client(own_server: RunningServer) -> Any:
    import openai

    return openai.OpenAI(
        base_url=f"{own_server.url}/v1", api_key="unused", timeout=60, max_retries=0
    )


def _chat(client: Any, messages: list[dict[str, Any]], **body: Any) -> Any:
    """The oracle: the same conversation as a chat completion, sent twice so that both
    routes meet the same prefix-cache pages."""
    client.chat.completions.create(model="tiny-llama", messages=messages, **body)
    return client.chat.completions.create(model="tiny-llama", messages=messages, **body)


def test_text_input_equals_the_chat_completion(client: Any) -> None:
    want = _chat(client, [{"role": "user", "content": "hello there"}], max_tokens=8, temperature=0)
    out = client.responses.create(
        model="tiny-llama", input="hello there", max_output_tokens=8, temperature=0
    )
    assert out.object == "response" and out.id.startswith("resp_")
    assert out.output_text == want.choices[0].message.content
    assert [o.type for o in out.output] == ["message"] and out.output[0].role == "assistant"
    cut = want.choices[0].finish_reason == "length"
    assert out.status == ("incomplete" if cut else "completed")
    if cut:
        assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.input_tokens == want.usage.prompt_tokens
    assert out.usage.output_tokens == want.usage.completion_tokens
    assert out.usage.total_tokens == want.usage.total_tokens


def test_instructions_and_messages_equal_the_chat_completion(client: Any) -> None:
    history = [
        {"role": "user", "content": [
            {"type": "input_text", "text": "name a "}, {"type": "input_text", "text": "colour"}
        ]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "red"}]},
        {"role": "user", "content": "another"},
    ]  # fmt: skip
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "name a colour"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "another"},
    ]
    want = _chat(client, messages, max_tokens=6, temperature=0)
    out = client.responses.create(
        model="tiny-llama",
        instructions="be brief",
        input=history,
        max_output_tokens=6,
        temperature=0,
    )
    assert out.output_text == want.choices[0].message.content
    assert out.instructions == "be brief"
    assert out.usage.input_tokens == want.usage.prompt_tokens


def test_streamed_events(client: Any) -> None:
    want = client.responses.create(
        model="tiny-llama", input="a story", max_output_tokens=10, temperature=0
    )
    events = list(
        client.responses.create(
            model="tiny-llama", input="a story", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{want.status}",
    ]
    assert kinds[:4] == head and kinds[-4:] == tail
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == want.output_text
    assert events[-5 + 1].text == want.output_text  # output_text.done
    last = events[-1].response
    assert last.output_text == want.output_text and last.status == want.status
    assert last.usage.output_tokens == want.usage.output_tokens
    assert events[0].response.status == "in_progress"


def test_text_format_json_schema(client: Any) -> None:
    fmt = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    messages = [{"role": "user", "content": "a city"}]
    want = _chat(
        client,
        messages,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
    )
    out = client.responses.create(
        model="tiny-llama",
        input="a city",
        max_output_tokens=60,
        temperature=0,
        text={"format": fmt},
    )
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)
    assert out.output_text == want.choices[0].message.content
    assert out.text.format.type == "json_schema"
    sampled = client.responses.create(
        model="tiny-llama", input="a city", max_output_tokens=60, text={"format": fmt}
    )
    jsonschema.validate(json.loads(sampled.output_text), SCHEMA)


def test_text_format_json_object(client: Any) -> None:
    out = client.responses.create(
        model="tiny-llama",
        input="json",
        max_output_tokens=40,
        temperature=0,
        text={"format": {"type": "json_object"}},
    )
    want = _chat(
        client,
        [{"role": "user", "content": "json"}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert out.output_text == want.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"previous_response_id": "resp_x"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tool_choice"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": [IMAGE]}]}, "input"),
        ({"input": []}, "input"),
        ({"input": "x" * 200000}, "input"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
        ({"model": "other"}, "model"),
    ],
    ids=[
        "previous",
        "web-search",
        "auto-without-format",
        "unknown",
        "max-0",
        "image",
        "empty",
        "too-long",
        "no-schema",
        "model",
    ],
)
def test_refusals(own_server: RunningServer, body: dict[str, Any], param: str) -> None:
    base = {"input": "hi", "max_output_tokens": 4}
    r = httpx.post(f"{own_server.url}/v1/responses", json={**base, **body}, timeout=60)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.json()


# ---- tools ---------------------------------------------------------------------------------
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER},
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
    for t in TOOLS
]
ASK = "what is the weather in paris?"


@pytest.mark.parametrize(
    ("choice", "chat_choice"),
    [
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
    ids=["required", "named"],
)
def test_the_openai_client_tool_loop(client: Any, choice: Any, chat_choice: Any) -> None:
    body = {"max_output_tokens": 80, "temperature": 0, "parallel_tool_calls": False}
    out = client.responses.create(
        model="tiny-llama", input=ASK, tools=TOOLS, tool_choice=choice, **body
    )
    calls = [o for o in out.output if o.type == "function_call"]
    assert len(calls) == 1 and out.status == "completed"
    call = calls[0]
    schema = {t["name"]: t["parameters"] for t in TOOLS}[call.name]
    jsonschema.validate(json.loads(call.arguments), schema)
    # the chat route's call for the same conversation
    want = _chat(
        client,
        [{"role": "user", "content": ASK}],
        max_tokens=80,
        temperature=0,
        tools=CHAT_TOOLS,
        tool_choice=chat_choice,
        parallel_tool_calls=False,
    )
    chat_call = want.choices[0].message.tool_calls[0].function
    assert (call.name, call.arguments) == (chat_call.name, chat_call.arguments)
    # streamed: the same call, as function_call items and argument events
    events = list(
        client.responses.create(
            model="tiny-llama", input=ASK, tools=TOOLS, tool_choice=choice, stream=True, **body
        )
    )
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    streamed = events[-1].response.output
    assert [(o.type, o.name, o.arguments) for o in streamed] == [
        ("function_call", call.name, call.arguments)
    ]
    assert events[-4].delta == call.arguments
    # the tool's result goes back; the final answer is text, and equals the chat route's
    follow = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 c"},
    ]  # fmt: skip
    final = client.responses.create(
        model="tiny-llama", input=follow, tools=TOOLS, tool_choice="none", max_output_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert [o.type for o in final.output] == ["message"]
    chat_history = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 c"},
    ]
    answer = _chat(
        client, chat_history, max_tokens=8, temperature=0, tools=CHAT_TOOLS, tool_choice="none"
    )
    assert final.output_text == answer.choices[0].message.content
    assert final.usage.input_tokens == answer.usage.prompt_tokens


def test_parallel_calls_are_items(client: Any) -> None:
    out = client.responses.create(
        model="tiny-llama",
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=200,
        temperature=0,
    )
    want = _chat(
        client,
        [{"role": "user", "content": ASK}],
        max_tokens=200,
        temperature=0,
        tools=CHAT_TOOLS,
        tool_choice="required",
    )
    got = [(o.name, o.arguments) for o in out.output if o.type == "function_call"]
    calls = want.choices[0].message.tool_calls or []
    assert got == [(c.function.name, c.function.arguments) for c in calls]
    assert len({o.call_id for o in out.output if o.type == "function_call"}) == len(got)
