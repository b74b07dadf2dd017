"""vLLM's newer request fields over HTTP: ``structured_outputs`` (the current spelling of
``guided_*``: the same constraint gives the same output under either name, and it holds),
``prompt_logprobs`` (completions and chat, equal to the in-process engine's, vLLM's shape) and
chat ``echo`` (the assistant's last message before the reply, streamed and not)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.structured_outputs import no_additional_properties
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

PROMPT = "once upon a time there"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "n"],
}


@pytest.fixture(scope="module")
def own_server(make_server: ServerFactory) -> Iterator[RunningServer]:
    with make_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), **TINY_OPTIONS)


def _post(srv: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=60)


def _text(srv: RunningServer, **body: Any) -> str:
    base = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 7}
    r = _post(srv, "/v1/completions", {**base, **body})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


SPELLINGS = {
    "json": ({"guided_json": SCHEMA}, {"json": SCHEMA}),
    "json-text": ({"guided_json": json.dumps(SCHEMA)}, {"json": json.dumps(SCHEMA)}),
    "regex": ({"guided_regex": "[a-c]{2,5}-[0-9]+"}, {"regex": "[a-c]{2,5}-[0-9]+"}),
    "choice": ({"guided_choice": ["red", "green", "blue"]}, {"choice": ["red", "green", "blue"]}),
    "grammar": (
        {"guided_grammar": 'start: "x" ("y" | "z")+ "!"\n'},
        {"grammar": 'start: "x" ("y" | "z")+ "!"\n'},
    ),
    "json_object": ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    "whitespace": (
        {"guided_json": SCHEMA, "guided_whitespace_pattern": " ?"},
        {"json": SCHEMA, "whitespace_pattern": " ?"},
    ),
}


@pytest.mark.parametrize("kind", SPELLINGS)
def test_structured_outputs_equals_the_guided_spelling(
    own_server: RunningServer, kind: str
) -> None:
    old, new = SPELLINGS[kind]
    want = _text(own_server, **old)
    got = _text(own_server, structured_outputs=new)
    assert got == want
    if kind == "regex":
        assert re.fullmatch("[a-c]{2,5}-[0-9]+", got)
    if kind == "choice":
        assert got in ("red", "green", "blue")
    if kind == "grammar":
        assert re.fullmatch("x[yz]+!", got)


def test_structured_outputs_json_holds_through_chat(own_server: RunningServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "a person"}],
        "max_tokens": 60,
        "seed": 3,
        "structured_outputs": {"json": SCHEMA},
    }
    r = _post(own_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_disable_additional_properties(own_server: RunningServer) -> None:
    schema = {"type": "object", "properties": {"k": {"type": "integer", "maximum": 9}}}
    closed = {**schema, "additionalProperties": False}
    for seed in range(4):
        text = _text(
            own_server,
            seed=seed,
            structured_outputs={"json": schema, "disable_additional_properties": True},
        )
        jsonschema.validate(json.loads(text), closed)
        # the same as the closed schema sent as it is
        assert text == _text(own_server, seed=seed, structured_outputs={"json": closed})


def test_no_additional_properties_by_hand() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"type": "array", "items": {"properties": {"d": {"const": {"x": 1}}}}},
            "e": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"t": {"type": "object"}},
    }
    assert no_additional_properties(schema) == {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "string"}},
                "additionalProperties": False,
            },
            "c": {
                "type": "array",
                "items": {"properties": {"d": {"const": {"x": 1}}}, "additionalProperties": False},
            },
            "e": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"t": {"type": "object", "additionalProperties": False}},
        "additionalProperties": False,
    }


@pytest.mark.parametrize("value", [True, False])
def test_whitespace_and_fallback_options_keep_the_compact_layout(
    own_server: RunningServer, value: bool
) -> None:
    want = _text(own_server, guided_json=SCHEMA)
    options = {"disable_any_whitespace": value, "disable_fallback": value}
    assert _text(own_server, structured_outputs={"json": SCHEMA, **options}) == want


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"guided_json": SCHEMA, "structured_outputs": {"json": SCHEMA}},
            "structured_outputs.json",
        ),
        ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs.choice"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, None),
        ({"structured_outputs": {"jsn": SCHEMA}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        (
            {
                "guided_whitespace_pattern": " ",
                "structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "},
            },
            "structured_outputs.whitespace_pattern",
        ),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        (
            {"structured_outputs": {"disable_additional_properties": True}},
            "structured_outputs.disable_additional_properties",
        ),
        ({"structured_outputs": {"json": 3}}, "structured_outputs"),
    ],
    ids=[
        "both-spellings",
        "two-constraints",
        "format-and-regex",
        "unknown-key",
        "bad-regex",
        "empty-choice",
        "two-whitespace",
        "whitespace-not-json",
        "closed-without-schema",
        "schema-not-object",
    ],
)
def test_structured_outputs_refusals(
    own_server: RunningServer, body: dict[str, Any], param: str | None
) -> None:
    r = _post(own_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == (param or "structured_outputs.regex"), error
    if body.get("structured_outputs", {}).get("jsn"):
        assert "structured_outputs.jsn" in error["message"]


# ---- prompt_logprobs ---------------------------------------------------------------------------
def _want_prompt_logprobs(out: Any, num: int) -> list[Any]:
    """The engine's prompt logprobs as vLLM writes them: the prompt token plus ranks 1..num."""
    want: list[Any] = []
    for token_id, pos in zip(out.prompt_token_ids, out.prompt_logprobs, strict=True):
        if pos is None:
            want.append(None)
            continue
        want.append(
            {
                str(t): (lp.logprob, lp.rank, lp.decoded_token)
                for t, lp in pos.items()
                if t == token_id or lp.rank <= num
            }
        )
    return want


def _as_tuples(got: list[Any]) -> list[Any]:
    return [
        None
        if pos is None
        else {t: (e["logprob"], e["rank"], e["decoded_token"]) for t, e in pos.items()}
        for pos in got
    ]


def _approx(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want) and got[0] is None and want[0] is None
    for g, w in zip(got[1:], want[1:], strict=True):
        assert set(g) == set(w)
        for t in g:
            assert g[t][1:] == w[t][1:]
            assert g[t][0] == pytest.approx(w[t][0], abs=1e-6)


@pytest.mark.parametrize("num", [0, 2, 5])
def test_completion_prompt_logprobs_equal_the_engine(
    own_server: RunningServer, llm: LLM, num: int
) -> None:
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, prompt_logprobs=num), use_tqdm=False)
    want = _want_prompt_logprobs(out[0], num)
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "prompt_logprobs": num, "n": 2}
    r = _post(own_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:  # each choice carries its prompt's logprobs
        _approx(_as_tuples(choice["prompt_logprobs"]), want)
    # the same values as echo + logprobs reports for the prompt tokens
    echo = _post(own_server, "/v1/completions", {**body, "echo": True, "logprobs": 1, "n": 1})
    lps = echo.json()["choices"][0]["logprobs"]["token_logprobs"][: len(want)]
    own = [None] + [
        w[str(t)][0] for w, t in zip(want[1:], out[0].prompt_token_ids[1:], strict=True)
    ]
    assert lps[0] is None and lps[1:] == pytest.approx(own[1:], abs=1e-6)


def test_chat_prompt_logprobs_equal_the_engine(own_server: RunningServer, llm: LLM) -> None:
    messages = [{"role": "user", "content": "the cat sat on the mat"}]
    out = llm.chat([messages], SamplingParams(max_tokens=2, prompt_logprobs=3), use_tqdm=False)
    want = _want_prompt_logprobs(out[0], 3)
    body = {"messages": messages, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3}
    r = _post(own_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    _approx(_as_tuples(r.json()["prompt_logprobs"]), want)
    plain = _post(own_server, "/v1/chat/completions", {**body, "prompt_logprobs": None}).json()
    assert plain["prompt_logprobs"] is None


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21}),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": -1}),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1, "stream": True},
        ),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": True}),
    ],
    ids=["too-many", "negative", "stream", "chat-stream", "bool"],
)
def test_prompt_logprobs_refusals(
    own_server: RunningServer, path: str, extra: dict[str, Any]
) -> None:
    r = _post(own_server, path, {"max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_logprobs"


# ---- chat echo ---------------------------------------------------------------------------------
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


def _chat(srv: RunningServer, **body: Any) -> Any:
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = _post(srv, "/v1/chat/completions", {**base, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _chat_stream(srv: RunningServer, **body: Any) -> str:
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True}
    text = ""
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json={**base, **body}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content", "") or ""
    return text


def test_chat_echo_puts_the_assistant_message_first(own_server: RunningServer) -> None:
    messages = [
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    plain = _chat(own_server, messages=messages, **CONTINUE)["choices"][0]["message"]["content"]
    echoed = _chat(own_server, messages=messages, echo=True, **CONTINUE)
    assert echoed["choices"][0]["message"]["content"] == "Once upon a time" + plain
    streamed = _chat_stream(own_server, messages=messages, echo=True, **CONTINUE)
    assert streamed == "Once upon a time" + plain
    # usage counts only the generated tokens, as without echo
    assert echoed["usage"]["completion_tokens"] == 6


def test_chat_echo_adds_nothing_after_a_user_message(own_server: RunningServer) -> None:
    messages = [{"role": "user", "content": "tell me a story"}]
    plain = _chat(own_server, messages=messages)["choices"][0]["message"]["content"]
    echoed = _chat(own_server, messages=messages, echo=True)["choices"][0]["message"]["content"]
    assert echoed == plain


def test_chat_echo_through_the_openai_client(own_server: RunningServer) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{own_server.url}/v1", api_key="x", max_retries=0)
    messages: Any = [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": "one two"},
    ]
    out = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_tokens=4,
        temperature=0,
        extra_body={"echo": True, **CONTINUE},
    )
    assert out.choices[0].message.content.startswith("one two")
