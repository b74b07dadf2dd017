"""Tool calling through the official openai client: calls forced by ``tool_choice``
("required", a named function) on the tiny model's ChatML template, and the model's own
Hermes-style calls under "auto" on a tiny model whose template writes them (its vocabulary
holds ``<tool_call>`` / ``</tool_call>``, so ``logit_bias`` can make it open a call). Every
call is checked with jsonschema against its tool's schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jsonschema
import pytest

from pagedattn.model.tokenizer import Tokenizer
from pagedattn.server.app import build_app
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory, serve_app
from tests.server.tiny_folder import write_tiny_folder
from tests.server.tool_schemas import MAX_TOKENS, TOOL_SCHEMAS
from tests.server.tool_templates import HERMES_TEMPLATE

USER = [{"role": "user", "content": "what is the weather in paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def tool(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def openai_client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """This module's own tiny-model server (ChatML template: no tool format), so that the
    session server's prefix cache stays untouched."""
    with make_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def hermes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hermes") / "tiny-hermes"
    return write_tiny_folder(
        folder,
        added_tokens=("<tool_call>", "</tool_call>"),
        chat_template=HERMES_TEMPLATE,
        context=2048,
    )


@pytest.fixture(scope="module")
def hermes(hermes_dir: Path) -> Iterator[RunningServer]:
    with serve_app(build_app(str(hermes_dir), **TINY_OPTIONS)) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_bias(hermes_dir: Path) -> dict[str, int]:
    """logit_bias that makes the tiny model write ``<tool_call>`` whenever it may."""
    (tag,) = Tokenizer.from_folder(hermes_dir).encode("<tool_call>", add_special_tokens=False)
    return {str(tag): 100}


def check_calls(message: Any, schemas: dict[str, dict[str, Any]]) -> list[Any]:
    """Every call names a given tool and its arguments validate; the parsed arguments."""
    assert message.tool_calls, message
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, schemas[call.function.name])
        out.append(args)
    return out


def check_forced_calls(
    client: Any, model: str, schemas: list[dict[str, Any]], other: str = "other"
) -> list[Any]:
    """For each schema, one forced call (named, then ``required``, alternating) beside the
    tool ``other``: the call validates against its schema; the parsed arguments."""
    parsed = []
    for i, schema in enumerate(schemas):
        name = f"tool_{i}"
        choice: Any = "required" if i % 2 else {"type": "function", "function": {"name": name}}
        out = client.chat.completions.create(
            model=model,
            messages=USER,
            tools=[tool(other, WEATHER), tool(name, schema)],
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=i,
        )
        c = out.choices[0]
        assert c.finish_reason == "tool_calls", (i, c)
        assert c.message.content is None
        (args,) = check_calls(c.message, {name: schema, other: WEATHER})
        if not i % 2:
            assert [t.function.name for t in c.message.tool_calls] == [name]
        parsed.append(args)
    return parsed


def test_forced_calls_validate_for_twenty_schemas(server: RunningServer) -> None:
    check_forced_calls(openai_client(server.url), "tiny-llama", TOOL_SCHEMAS)


def test_parallel_tool_calls_false_makes_one_call(server: RunningServer) -> None:
    client = openai_client(server.url)
    tools = [tool("weather", WEATHER), tool("ping", {"type": "object", "properties": {}})]
    counts = {}
    for parallel in (False, True):
        counts[parallel] = []
        for seed in range(6):
            out = client.chat.completions.create(
                model="tiny-llama",
                messages=USER,
                tools=tools,
                tool_choice="required",
                parallel_tool_calls=parallel,
                max_tokens=400,
                seed=seed,
            )
            message = out.choices[0].message
            check_calls(message, {"weather": WEATHER, "ping": {"type": "object"}})
            counts[parallel].append(len(message.tool_calls))
    assert counts[False] == [1] * 6  # the grammar's array holds one call
    assert max(counts[True]) > 1, counts


def test_auto_without_a_tool_format_is_a_400(server: RunningServer) -> None:
    import openai

    client = openai_client(server.url)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-llama", messages=USER, tools=[tool("weather", WEATHER)], max_tokens=4
        )
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert "chat template" in err.value.body["message"]  # type: ignore[index]
    none = client.chat.completions.create(
        model="tiny-llama",
        messages=USER,
        tools=[tool("weather", WEATHER)],
        tool_choice="none",
        max_tokens=4,
    )
    assert none.choices[0].message.tool_calls is None


def test_auto_reply_without_a_call_is_content(hermes: RunningServer) -> None:
    out = openai_client(hermes.url).chat.completions.create(
        model="tiny-hermes",
        messages=USER,
        tools=[tool("weather", WEATHER)],
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    c = out.choices[0]
    assert c.message.tool_calls is None and c.finish_reason == "length"
    assert c.message.content and "<tool_call>" not in c.message.content


def render_expected(hermes_dir: Path, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    """The prompt ids of a conversation, rendered by jinja2 itself (not the server's renderer)
    with the calls' arguments as objects."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    for m in messages:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = env.from_string(HERMES_TEMPLATE).render(
        messages=messages, tools=tools, add_generation_prompt=True
    )
    return Tokenizer.from_folder(hermes_dir).encode(text, add_special_tokens=False)


def test_openai_client_tool_loop_under_auto(
    hermes: RunningServer, hermes_dir: Path, open_bias: dict[str, int]
) -> None:
    client = openai_client(hermes.url)
    tools = [tool("weather", WEATHER)]
    first = client.chat.completions.create(
        model="tiny-hermes",
        messages=USER,
        tools=tools,
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
        seed=3,
        logit_bias=open_bias,
    )
    c = first.choices[0]
    assert c.finish_reason == "tool_calls"
    (args,) = check_calls(c.message, {"weather": WEATHER})
    call = c.message.tool_calls[0]
    result = {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}
    messages = [*USER, c.message, result]
    final = client.chat.completions.create(
        model="tiny-hermes", messages=messages, tools=tools, max_tokens=12, temperature=0
    )
    f = final.choices[0]
    assert f.message.tool_calls is None and f.finish_reason in ("stop", "length")
    assert f.message.content
    sent = [*USER, c.message.model_dump(exclude_none=True), result]
    expected = render_expected(hermes_dir, json.loads(json.dumps(sent)), tools)
    assert final.usage.prompt_tokens == len(expected)
    assert '"arguments": ' + json.dumps(args, ensure_ascii=False) in Tokenizer.from_folder(
        hermes_dir
    ).decode(expected)


def test_streamed_call_assembles_like_the_whole_reply(
    hermes: RunningServer, open_bias: dict[str, int]
) -> None:
    client = openai_client(hermes.url)
    kwargs: dict[str, Any] = {
        "model": "tiny-hermes",
        "messages": USER,
        "tools": [tool("weather", WEATHER)],
        "max_tokens": MAX_TOKENS,
        "seed": 5,
        "parallel_tool_calls": False,
        "logit_bias": open_bias,
    }
    whole = client.chat.completions.create(**kwargs).choices[0]
    with client.chat.completions.stream(**kwargs) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    pairs = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert [(t.function.name, t.function.arguments) for t in streamed.message.tool_calls] == pairs
    check_calls(streamed.message, {"weather": WEATHER})
    assert not streamed.message.content


def test_one_of_schemas_are_served(server: RunningServer) -> None:
    client = openai_client(server.url)
    for i, schema in enumerate(TOOL_SCHEMAS[-3:]):
        out = client.chat.completions.create(
            model="tiny-llama",
            messages=USER,
            max_tokens=MAX_TOKENS,
            seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    import openai

    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-llama",
            messages=USER,
            max_tokens=8,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": overlapping},
            },
        )
    assert err.value.body["param"] == "response_format"  # type: ignore[index]


def test_bad_tools_are_400s_naming_the_field(server: RunningServer) -> None:
    import openai

    client = openai_client(server.url)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        (
            {
                "tools": [tool("a", WEATHER)],
                "tool_choice": {"type": "function", "function": {"name": "b"}},
            },
            "tool_choice",
        ),
        ({"tools": [tool("a", WEATHER)], "tool_choice": "always"}, "tool_choice"),
        (
            {
                "tools": [tool("a", WEATHER)],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="tiny-llama", messages=USER, max_tokens=4, extra_body=extra
            )
        assert err.value.body["param"] == param, (extra, err.value.body)  # type: ignore[index]
