"""vLLM's structural tag through the official openai client: free text, and after each trigger
the structure's ``begin``, JSON valid for its schema (checked with jsonschema) and ``end``;
sent as ``structured_outputs.structural_tag`` (object or JSON text) or as ``response_format``.
``logit_bias`` on the triggers' tokens makes the tiny random model open segments. Each
malformed tag is a 400 naming the field's path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from pagedattn.model.tokenizer import Tokenizer
from pagedattn.server.app import build_app
from tests.server.conftest import TINY_OPTIONS, RunningServer, serve_app
from tests.server.tiny_folder import write_tiny_folder

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
COUNT = {"type": "integer", "minimum": 0, "maximum": 99}
TAG: dict[str, Any] = {
    "type": "structural_tag",
    "structures": [
        {"begin": "<fn=weather>", "schema": WEATHER, "end": "</fn>"},
        {"begin": "<fn=count>", "schema": COUNT, "end": "</fn>"},
        {"begin": "<|im_start|>", "schema": {"type": "boolean"}, "end": "\n"},
    ],
    "triggers": ["<fn=", "<|im_start|>"],
}
ADDED = ("<fn=", "</fn>")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_folder(tmp_path_factory.mktemp("stag") / "tiny-stag", added_tokens=ADDED)


@pytest.fixture(scope="module")
def srv(folder: Path) -> Iterator[RunningServer]:
    with serve_app(build_app(str(folder), **TINY_OPTIONS)) as running:
        yield running


@pytest.fixture(scope="module")
def bias(folder: Path) -> dict[str, int]:
    """Makes the model write a trigger token whenever it may (``<|im_start|>`` less often)."""
    tok = Tokenizer.from_folder(folder)
    (fn,) = tok.encode("<fn=", add_special_tokens=False)
    (start,) = tok.encode("<|im_start|>", add_special_tokens=False)
    return {str(fn): 6, str(start): 4}


def openai_client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


def segments(text: str, tag: dict[str, Any], cut: bool) -> tuple[list[tuple[int, Any]], list[str]]:
    """The text's whole segments as (structure index, parsed JSON) and the free text between
    them; fails when a trigger is not followed by a whole structure (except at the end of a
    ``cut`` text: one cut by ``max_tokens``)."""
    found, free, pos = [], [], 0
    decoder = json.JSONDecoder()
    while True:
        starts = [(text.find(t, pos), t) for t in tag["triggers"] if text.find(t, pos) >= 0]
        if not starts:
            free.append(text[pos:])
            return found, free
        at, _ = min(starts)
        free.append(text[pos:at])
        matches = [i for i, s in enumerate(tag["structures"]) if text.startswith(s["begin"], at)]
        if cut and not matches and any(s["begin"].startswith(text[at:]) for s in tag["structures"]):
            return found, free
        assert len(matches) == 1, (text, at)
        (i,) = matches
        s = tag["structures"][i]
        try:
            value, end = decoder.raw_decode(text, at + len(s["begin"]))
        except ValueError:
            assert cut, text
            return found, free
        if cut and s["end"].startswith(text[end:]) and text[end:] != s["end"]:
            return found, free
        assert text.startswith(s["end"], end), (text, end)
        found.append((i, value))
        pos = end + len(s["end"])


def check(text: str, tag: dict[str, Any], finish_reason: str) -> list[tuple[int, Any]]:
    """The whole segments of ``text``, each validated against its structure's schema."""
    found, _ = segments(text, tag, finish_reason == "length")
    for i, value in found:
        jsonschema.validate(value, tag["structures"][i]["schema"])
    return found


def _chat(srv: RunningServer, bias: dict[str, int], seed: int, extra: dict[str, Any]) -> Any:
    out = openai_client(srv.url).chat.completions.create(
        model="tiny-stag",
        messages=[{"role": "user", "content": "the weather, then a count"}],
        max_tokens=80,
        temperature=1.0,
        seed=seed,
        logit_bias=bias,
        extra_body={"skip_special_tokens": False, **extra},
    )
    return out.choices[0]


def test_every_segment_validates_and_text_between_is_free(
    srv: RunningServer, bias: dict[str, int]
) -> None:
    kinds: set[int] = set()
    free_text = []
    for seed in range(6):
        c = _chat(srv, bias, seed, {"structured_outputs": {"structural_tag": TAG}})
        text = c.message.content or ""
        kinds |= {i for i, _ in check(text, TAG, c.finish_reason)}
        free_text += [t for t in segments(text, TAG, c.finish_reason == "length")[1] if t.strip()]
    assert kinds == {0, 1, 2}, kinds  # every structure, both triggers, the special-token one
    assert free_text  # text outside the segments is unconstrained


def test_the_three_spellings_and_streaming_constrain_alike(
    srv: RunningServer, bias: dict[str, int]
) -> None:
    client = openai_client(srv.url)
    base = {
        "model": "tiny-stag",
        "prompt": "once upon a time",
        "max_tokens": 60,
        "seed": 11,
        "logit_bias": bias,
    }
    outs = [
        client.completions.create(**base, extra_body={"skip_special_tokens": False, **extra})
        for extra in (
            {"structured_outputs": {"structural_tag": TAG}},
            {"structured_outputs": {"structural_tag": json.dumps(TAG)}},
            {"response_format": TAG},
        )
    ]
    texts = {r.choices[0].text for r in outs}
    stream = client.completions.create(
        **base, stream=True, extra_body={"skip_special_tokens": False, "response_format": TAG}
    )
    texts.add("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    assert len(texts) == 1
    assert check(texts.pop(), TAG, outs[0].choices[0].finish_reason)


def test_closed_objects_under_disable_additional_properties(
    srv: RunningServer, bias: dict[str, int]
) -> None:
    open_schema = {"type": "object", "properties": {"k": {"type": "integer"}}}
    tag = {"structures": [{"begin": "<fn=", "schema": open_schema, "end": "</fn>"}]}
    tag["triggers"] = ["<fn="]
    closed = {**tag, "structures": [{**tag["structures"][0]}]}
    closed["structures"][0]["schema"] = {**open_schema, "additionalProperties": False}
    first_keys: dict[bool, set[str]] = {True: set(), False: set()}
    for flag in (True, False):
        for seed in range(3):
            so = {"structural_tag": tag, "disable_additional_properties": flag}
            c = _chat(srv, bias, seed, {"structured_outputs": so})
            text = c.message.content or ""
            check(text, closed if flag else tag, c.finish_reason)
            at = text.find('<fn={"')  # the first key's first character
            if at >= 0 and len(text) > at + 6:
                first_keys[flag].add(text[at + 6])
    assert first_keys[True] == {"k"}, first_keys
    assert first_keys[False] - {"k"}, first_keys  # without the option other keys may appear


def _refusal(srv: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    base = {"prompt": "hi", "max_tokens": 4}
    r = httpx.post(f"{srv.url}/v1/completions", json={**base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    return dict(r.json()["error"])


def _with(**changes: Any) -> dict[str, Any]:
    return {**TAG, **changes}


FIELD = "structured_outputs.structural_tag"
STRUCT = TAG["structures"][0]


@pytest.mark.parametrize(
    ("tag", "param"),
    [
        ("{not json", FIELD),
        (_with(structures=[{**STRUCT, "extra": 1}]), f"{FIELD}.structures[0].extra"),
        (_with(structures=[{"begin": "<fn=", "schema": {}}]), f"{FIELD}.structures[0].end"),
        (_with(structures=[{**STRUCT, "begin": "fn=x"}]), f"{FIELD}.structures[0].begin"),
        (
            _with(structures=[STRUCT, {**STRUCT, "schema": {"type": "foo"}}]),
            f"{FIELD}.structures[1].schema",
        ),
        (_with(structures=[{**STRUCT, "schema": None}]), f"{FIELD}.structures[0].schema"),
        (_with(structures=[{**STRUCT, "schema": {"$ref": "#"}}]), f"{FIELD}.structures[0].schema"),
        (_with(structures=[]), f"{FIELD}.structures"),
        (_with(triggers=["<fn=", ""]), f"{FIELD}.triggers[1]"),
        (_with(triggers=["<fn=", "<fn"]), f"{FIELD}.triggers[1]"),
        ({"type": "structural_tag", "format": {"type": "any_text"}}, f"{FIELD}.format"),
        (_with(type="tag"), f"{FIELD}.type"),
        (_with(at_least_one=True), f"{FIELD}.at_least_one"),
    ],
    ids=[
        "not-json",
        "unknown-key",
        "no-end",
        "begin-without-trigger",
        "bad-schema",
        "null-schema",
        "schema-without-instance",
        "no-structures",
        "empty-trigger",
        "overlapping-triggers",
        "xgrammar-format",
        "wrong-type",
        "unknown-top-key",
    ],
)
def test_malformed_tags_are_refused_naming_the_path(
    srv: RunningServer, tag: Any, param: str
) -> None:
    error = _refusal(srv, {"structured_outputs": {"structural_tag": tag}})
    assert error["param"] == param, error
    assert error["message"].startswith(param), error


def test_response_format_refusals_name_the_path(srv: RunningServer) -> None:
    bad = _with(structures=[{**STRUCT, "schema": {"type": "foo"}}])
    error = _refusal(srv, {"response_format": bad})
    assert error["param"] == "response_format.structures[0].schema", error
    error = _refusal(srv, {"response_format": {**TAG, "json_schema": {"name": "x"}}})
    assert error["param"] == "response_format.json_schema", error
    both = {"response_format": TAG, "structured_outputs": {"structural_tag": TAG}}
    assert _refusal(srv, both)["param"] == FIELD
    pattern = {"structural_tag": TAG, "whitespace_pattern": " "}
    error = _refusal(srv, {"structured_outputs": pattern})
    assert error["param"] == "structured_outputs.whitespace_pattern", error
