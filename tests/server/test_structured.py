"""Structured output through the HTTP routes (the openai client as the judge): every output of
20 bounded schemas ends with reason ``stop`` and validates with ``jsonschema``; regex, choice
and grammar constraints hold; bad constraints are 400s naming the field. The tiny random
model does whatever the mask leaves it, so these outputs come from the grammar alone."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import RunningServer, ServerFactory
from tests.server.schemas import MAX_TOKENS, SCHEMAS

MESSAGES = [{"role": "user", "content": "give me json"}]


@pytest.fixture(scope="module")
def server(make_server: ServerFactory) -> Iterator[RunningServer]:
    """This module's own tiny-model server: the session server's prefix cache, which other
    modules' cached-token counts depend on, stays untouched."""
    with make_server() as srv:
        yield srv


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def test_twenty_bounded_schemas_stop_parse_and_validate(client: Any) -> None:
    def ask(i: int) -> tuple[str | None, str | None]:
        out = client.chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=i,
            response_format=json_schema_format(SCHEMAS[i]),
        )
        return out.choices[0].message.content, out.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(len(SCHEMAS))))
    for schema, (text, reason) in zip(SCHEMAS, results, strict=True):
        assert reason == "stop", (schema, text)
        assert text is not None
        jsonschema.validate(json.loads(text), schema)


def test_completions_guided_json_streamed_equals_unstreamed(client: Any) -> None:
    schema = SCHEMAS[5]
    kwargs: dict[str, Any] = {
        "model": "tiny-llama",
        "prompt": "person:",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "extra_body": {"guided_json": schema},
    }
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_json_object_is_an_object(client: Any) -> None:
    out = client.chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = out.choices[0].message.content
    # the random model may not close the object in time; what it wrote is an object's start
    assert text.startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regex_choice_and_grammar_hold(client: Any, seed: int) -> None:
    def complete(extra: dict[str, Any]) -> Any:
        out = client.completions.create(
            model="tiny-llama",
            prompt="x",
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            extra_body=extra,
        )
        assert out.choices[0].finish_reason == "stop"
        return out.choices[0].text

    assert re.fullmatch(r"[a-c]{3}-[0-9]{2}", complete({"guided_regex": "[a-c]{3}-[0-9]{2}"}))
    choices = ["yes", "no", "maybe so", 'say "hi"']
    assert complete({"guided_choice": choices}) in choices
    grammar = 'start: "(" item ("," item)? ")"\nitem: "a" | "bb"\n'
    assert re.fullmatch(r"\((a|bb)(,(a|bb))?\)", complete({"guided_grammar": grammar}))


def test_text_response_format_is_unconstrained(client: Any) -> None:
    base = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**base, extra_body={"ignore_eos": True})
    text = client.chat.completions.create(
        **base, response_format={"type": "text"}, extra_body={"ignore_eos": True}
    )
    assert text.choices[0].message.content == plain.choices[0].message.content


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("two-constraints", {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    (
        "format-and-guided",
        {"response_format": {"type": "json_object"}, "guided_json": {"type": "object"}},
        "guided_json",
    ),
    ("schema-missing", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("bad-regex", {"guided_regex": "a(b"}, "guided_regex"),
    ("empty-choice", {"guided_choice": []}, "guided_choice"),
    ("bad-grammar", {"guided_grammar": "start: nothing_defined"}, "guided_grammar"),
    ("bad-schema-type", {"guided_json": {"type": "banana"}}, "guided_json"),
    (
        "backend",
        {"guided_json": {"type": "object"}, "guided_decoding_backend": "xgrammar"},
        "guided_decoding_backend",
    ),
    (
        "whitespace-without-json",
        {"guided_regex": "a", "guided_whitespace_pattern": " "},
        "guided_whitespace_pattern",
    ),
    ("format-type", {"response_format": {"type": "yaml"}}, "response_format"),
]


@pytest.mark.parametrize(("body", "param"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_constraints_are_400_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str
) -> None:
    request = {"messages": MESSAGES, "max_tokens": 4, **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=request, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_whitespace_pattern_is_honoured(client: Any) -> None:
    schema = SCHEMAS[6]
    out = client.completions.create(
        model="tiny-llama",
        prompt="point:",
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"guided_json": schema, "guided_whitespace_pattern": "\n"},
    )
    text = out.choices[0].text
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)
    outside_strings = re.sub(r'"[^"]*"', "", text)
    assert " " not in outside_strings  # the default layout would put ": " and ", " there


def test_n_choices_each_follow_the_grammar(client: Any) -> None:
    # n > 1 runs child requests that share one processor, which must follow each
    # child's own tokens (rollback to the common prefix) rather than mix them
    schema = SCHEMAS[4]
    out = client.completions.create(
        model="tiny-llama",
        prompt="digits:",
        n=4,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=3,
        extra_body={"guided_json": schema},
    )
    texts = [c.text for c in out.choices]
    assert len(texts) == 4 and len(set(texts)) > 1  # the children did diverge
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), schema)
