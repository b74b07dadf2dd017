"""Tools built by ``openai.pydantic_function_tool`` from nested pydantic models (their schema
refers to the nested model through ``$defs`` / ``$ref``), on the embedded SmolLM2 through the
official client, under tool_choice "required" (one tool and two), a named function, and "auto":
each is served, and every call the model writes parses as the pydantic model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import RunningServer
from tests.server.tool_templates import HERMES_TEMPLATE

MODEL = "SmolLM2-135M-Instruct"


class Address(BaseModel):
    street: str = Field(max_length=20)
    city: str = Field(max_length=12)


class Person(BaseModel):
    """Save a person and where they live."""

    name: str = Field(max_length=16)
    address: Address


class Trip(BaseModel):
    """Plan a trip between two addresses."""

    start: Address
    end: Address
    days: int = Field(ge=1, le=9)


QUESTION = [
    {
        "role": "user",
        "content": "Save this contact: Alice Martin lives at 12 Rue Cler in Paris.",
    }
]


def _client(srv: RunningServer) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", timeout=300, max_retries=0)


def _tools() -> list[Any]:
    import openai

    tools = [openai.pydantic_function_tool(Person), openai.pydantic_function_tool(Trip)]
    for tool in tools:  # the shape under test: a nested model reached through $defs
        assert "$defs" in tool["function"]["parameters"]
    return tools


def _check_calls(message: Any) -> list[str]:
    models = {"Person": Person, "Trip": Trip}
    names = []
    for call in message.tool_calls or []:
        models[call.function.name].model_validate(json.loads(call.function.arguments))
        names.append(call.function.name)
    return names


@pytest.mark.model
@pytest.mark.parametrize("num_tools", [1, 2])
def test_required_with_defs(smollm2_server: RunningServer, num_tools: int) -> None:
    out = _client(smollm2_server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=_tools()[:num_tools],
        tool_choice="required",
        temperature=0,
        max_tokens=120,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    names = _check_calls(choice.message)
    assert names and set(names) <= {"Person", "Trip"}
    if num_tools == 1:
        assert set(names) == {"Person"}


@pytest.mark.model
def test_named_with_defs(smollm2_server: RunningServer) -> None:
    out = _client(smollm2_server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=_tools(),
        tool_choice={"type": "function", "function": {"name": "Trip"}},
        temperature=0,
        max_tokens=120,
    )
    assert _check_calls(out.choices[0].message) == ["Trip"]


@pytest.mark.model
def test_auto_with_defs(smollm2_server: RunningServer) -> None:
    out = _client(smollm2_server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=_tools(),
        tool_choice="auto",
        temperature=0,
        max_tokens=120,
        extra_body={"chat_template": HERMES_TEMPLATE},
    )
    choice = out.choices[0]
    names = _check_calls(choice.message)  # a call, when written, is a valid model
    assert choice.finish_reason == ("tool_calls" if names else choice.finish_reason)
