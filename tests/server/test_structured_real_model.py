"""Structured output on the embedded SmolLM2-135M-Instruct through `pagedattn serve` and the
openai client: 20 bounded schemas, each output ends with reason ``stop`` within ``MAX_TOKENS``
and validates with ``jsonschema``; ``json_object`` gives an object."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tests.server.conftest import serve_subprocess
from tests.server.schemas import MAX_TOKENS, SCHEMAS


@pytest.mark.model
def test_smollm2_twenty_schemas_stop_and_validate() -> None:
    import openai

    args = ["--kv-cache-mib", "64", "--log-level", "warning"]
    with serve_subprocess(args, timeout=180) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

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
