"""Constraints that admit no output, on the embedded SmolLM2 through the openai client: a schema
with no finite instance, logit_bias banning every id (or every id a choice starts with),
min_tokens past a closed choice, each a 400 naming the fields before the request is queued; a
schema that has finite instances but lets a decoder nest forever is served (its object branch
pruned where it never ends, or cut with finish reason "length"), never a 500, and streamed
never ends as a success with invalid JSON."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import RunningServer
from tests.server.test_errors import assert_error_shape

MODEL = "SmolLM2-135M-Instruct"
NODE_DEFS = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"child": {"$ref": "#/$defs/node"}},
            "required": ["child"],
        }
    },
    "$ref": "#/$defs/node",
}
ARRAY_OF_ITSELF = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
ARRAY_DEFS = {
    "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}},
    "$ref": "#/$defs/a",
}
NESTED_ROOT = {"properties": {"c": {"$ref": "#"}}, "required": ["c"]}
MESSAGES = [{"role": "user", "content": "Give me a JSON value."}]


def _chat(srv: RunningServer, **body: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0, **body}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


@pytest.mark.model
@pytest.mark.parametrize("schema", [NODE_DEFS, ARRAY_OF_ITSELF, ARRAY_DEFS], ids=str)
@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_with_no_finite_instance_is_a_400(
    smollm2_server: RunningServer, schema: Any, stream: bool
) -> None:
    r = _chat(smollm2_server, response_format=_schema_format(schema), stream=stream)
    err = assert_error_shape(r, 400)
    assert err["param"] == "response_format" and "no finite instance" in err["message"]
    r = _chat(smollm2_server, guided_json=schema)
    assert assert_error_shape(r, 400)["param"] == "guided_json"


@pytest.mark.model
def test_a_schema_that_can_nest_forever_never_fails(smollm2_server: RunningServer) -> None:
    # {"c": 1} is an instance, and so is any non-object; a decoder may also open "{" forever
    fmt = _schema_format(NESTED_ROOT)
    r = _chat(smollm2_server, response_format=fmt, max_tokens=64)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), NESTED_ROOT)
    else:
        assert choice["finish_reason"] == "length"
    r = _chat(smollm2_server, response_format=fmt, max_tokens=64, stream=True)
    assert r.status_code == 200
    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), r.text
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    reason = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    if reason == "stop":
        jsonschema.validate(json.loads(text), NESTED_ROOT)
    else:
        assert reason == "length"


@pytest.mark.model
def test_banning_every_id_is_a_400(smollm2_server: RunningServer) -> None:
    info = httpx.get(f"{smollm2_server.url}/tokenizer_info", timeout=30).json()
    bias = {str(i): -100 for i in range(info["vocab_size"])}
    for stream in (False, True):
        r = _chat(smollm2_server, logit_bias=bias, stream=stream)
        err = assert_error_shape(r, 400)
        assert err["param"] == "logit_bias" and "admit no output" in err["message"]
    almost = {k: v for k, v in bias.items() if k != "28"}  # one id left: served
    r = _chat(smollm2_server, logit_bias=almost, max_tokens=3)
    assert r.status_code == 200, r.text


@pytest.mark.model
def test_min_tokens_past_a_closed_choice_is_a_400(smollm2_server: RunningServer) -> None:
    r = _chat(smollm2_server, min_tokens=10, guided_choice=["yes", "no"])
    err = assert_error_shape(r, 400)
    assert err["param"] == "min_tokens" and "guided_choice" in err["message"]
    # "yes" is one token: the choice is complete before min_tokens, and end-of-sequence may
    # not come yet; known only while decoding: the completion is cut ("length"), not failed
    r = _chat(smollm2_server, min_tokens=2, guided_choice=["yes"], max_tokens=8)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "yes"
    r = _chat(smollm2_server, min_tokens=2, guided_choice=["yes"], max_tokens=8, stream=True)
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    assert r.status_code == 200 and not any("error" in e for e in events), r.text
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "length"


@pytest.mark.model
def test_a_choice_whose_first_tokens_are_banned_is_a_400(smollm2_server: RunningServer) -> None:
    url = smollm2_server.url
    # every id whose text is a non-empty prefix of "yes" (what a decoder may start "yes" with)
    starts = []
    for prefix in ("y", "ye", "yes"):
        body = {"prompt": prefix, "add_special_tokens": False}
        ids = httpx.post(f"{url}/tokenize", json=body, timeout=30).json()["tokens"]
        if len(ids) == 1:
            starts.append(ids[0])
    assert starts
    bias = {str(i): -100 for i in starts}
    r = _chat(smollm2_server, guided_choice=["yes"], logit_bias=bias)
    err = assert_error_shape(r, 400)
    assert err["param"] == "logit_bias" and "guided_choice" in err["message"]
    partial = {str(i): -100 for i in starts[:-1]}  # "yes" itself allowed: served
    r = _chat(smollm2_server, guided_choice=["yes"], logit_bias=partial)
    assert r.status_code == 200, (starts, r.text)
    assert r.json()["choices"][0]["message"]["content"] == "yes"
