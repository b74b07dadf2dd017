"""A server of a Qwen 2 or a Gemma 3 model (tiny random GGUFs written as llama.cpp writes those
families, with a ChatML template), driven through the official openai client as a user would:
forced tool calls whose arguments validate against their schemas (jsonschema), json_schema
output that parses and validates, and guided_choice answers among the choices."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from pagedattn.server.app import build_app
from tests.model.families import gguf_with_oracle
from tests.server.conftest import TINY_OPTIONS, RunningServer, serve_app
from tests.server.schemas import MAX_TOKENS, SCHEMAS
from tests.server.test_tools import (
    USER,
    check_forced_calls,
    openai_client,
)
from tests.server.tool_schemas import TOOL_SCHEMAS

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _, path = gguf_with_oracle(request.param, tmp_path_factory.mktemp(request.param))
    app = build_app(str(path), served_model_name=request.param, **TINY_OPTIONS)
    with serve_app(app) as srv:
        yield srv


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _model(server: RunningServer) -> str:
    (model,) = [m.id for m in openai_client(server.url).models.list().data]
    return str(model)


def test_forced_tool_calls_validate_against_their_schemas(server: RunningServer) -> None:
    client = openai_client(server.url)
    parsed = check_forced_calls(client, _model(server), TOOL_SCHEMAS[:4], other="weather")
    assert all(isinstance(args, dict) for args in parsed)


def test_json_schema_output_parses_and_validates(server: RunningServer) -> None:
    client = openai_client(server.url)
    for i, schema in enumerate(SCHEMAS[:4]):
        out = client.chat.completions.create(
            model=_model(server),
            messages=[{"role": "user", "content": "give me json"}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=i,
            response_format=json_schema_format(schema),
        )
        c = out.choices[0]
        assert c.finish_reason == "stop", (schema, c)
        jsonschema.validate(json.loads(c.message.content or ""), schema)


def test_guided_choice_answers_one_of_the_choices(server: RunningServer) -> None:
    client = openai_client(server.url)
    choices = ["paris", "rome", "a long answer with spaces"]
    for seed in range(4):
        out = client.chat.completions.create(
            model=_model(server),
            messages=USER,
            max_tokens=64,  # the tiny vocabulary spells the long choice nearly byte by byte
            temperature=1.0,
            seed=seed,
            extra_body={"guided_choice": choices},
        )
        assert out.choices[0].finish_reason == "stop"
        assert out.choices[0].message.content in choices
    completion = client.completions.create(
        model=_model(server), prompt="the city is", max_tokens=64, temperature=0.0,
        extra_body={"guided_choice": choices},
    )  # fmt: skip
    assert completion.choices[0].text in choices


def test_a_repeated_prompt_reports_its_full_pages_as_cached(server: RunningServer) -> None:
    """The second of two identical greedy chats answers the same, with ``cached_tokens`` the
    prompt's full pages of 4 tokens but the last prompt token (always computed)."""
    client = openai_client(server.url)
    messages = [{"role": "user", "content": "tell me about the mountains near lyon, briefly"}]
    replies = [
        client.chat.completions.create(
            model=_model(server), messages=messages, max_tokens=8, temperature=0.0
        )
        for _ in range(2)
    ]
    usage = replies[1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    page = TINY_OPTIONS["page_size"]
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // page * page
    assert replies[1].choices[0].message.content == replies[0].choices[0].message.content
