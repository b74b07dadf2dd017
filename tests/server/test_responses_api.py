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
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
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
        "tools",
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
