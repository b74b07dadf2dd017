"""Structured output on the embedded SmolLM2-135M-Instruct through `pagedattn serve` and the
openai client: 20 bounded schemas, each output ends with reason ``stop`` within ``MAX_TOKENS``
and validates with ``jsonschema``; ``json_object`` gives an object; a structural tag leaves
the few-shot answer the model writes anyway as it is, and holds its segment to the schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest

from tests.server.conftest import serve_subprocess
from tests.server.schemas import MAX_TOKENS, SCHEMAS


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    import openai

    args = ["--kv-cache-mib", "64", "--log-level", "warning"]
    with serve_subprocess(args, timeout=180) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.mark.model
def test_smollm2_twenty_schemas_stop_and_validate(client: Any) -> None:
    def ask(i: int) -> tuple[str | None, str | None]:
        schema = SCHEMAS[i]
        messages = [
            {"role": "system", "content": "Reply with JSON only."},
            {"role": "user", "content": f"Fill in this JSON schema: {json.dumps(schema)}"},
        ]
        out = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
            },
        )
        return out.choices[0].message.content, out.choices[0].finish_reason

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(ask, range(len(SCHEMAS))))
    for schema, (text, reason) in zip(SCHEMAS, results, strict=True):
        assert reason == "stop", (schema, text)
        assert text is not None
        jsonschema.validate(json.loads(text), schema)

    out = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content or ""), dict)
    else:  # ran out of tokens inside the object: still an object's prefix
        assert (out.choices[0].message.content or "").startswith("{")


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
    "additionalProperties": False,
}
FEW_SHOT = (
    "Q: What is the capital of Italy?\n"
    'A: Rome is the capital of Italy. <answer>{"city": "Rome"}</answer>\n'
    "Q: What is the capital of Spain?\n"
    'A: Madrid is the capital of Spain. <answer>{"city": "Madrid"}</answer>\n'
    "Q: What is the capital of France?\nA:"
)


def _tag(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "structures": [{"begin": "<answer>", "schema": schema, "end": "</answer>"}],
        "triggers": ["<answer>"],
    }


@pytest.mark.model
def test_smollm2_structural_tag(client: Any) -> None:
    def complete(**extra: Any) -> str:
        out = client.completions.create(
            model="SmolLM2-135M-Instruct",
            prompt=FEW_SHOT,
            max_tokens=40,
            temperature=0,
            stop=["\nQ:"],
            extra_body=extra,
        )
        return str(out.choices[0].text)

    free = complete()
    # the model follows the examples by itself: a mask that admits its tokens changes nothing
    assert complete(structured_outputs={"structural_tag": _tag(CITY)}) == free
    before, rest = free.split("<answer>", 1)
    segment, _ = rest.split("</answer>", 1)
    jsonschema.validate(json.loads(segment), CITY)
    # a schema that only admits another city holds the segment to it; the free text stays
    lyon = {**CITY, "properties": {"city": {"enum": ["Lyon"]}}}
    held = complete(structured_outputs={"structural_tag": _tag(lyon)})
    assert held.startswith(before + '<answer>{"city": "Lyon"}</answer>'), held
