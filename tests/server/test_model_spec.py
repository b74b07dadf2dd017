"""The served model's description (ModelSpec): built from an engine, sent as plain JSON and
rebuilt, it tokenises, renders chat and computes limits exactly as the engine does; a server
built on the rebuilt spec answers as one built on the engine; malformed wire data is refused
naming the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.catalogue import resolve_model
from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf
from pagedattn.model.tokenizer import Tokenizer
from pagedattn.server.app import create_client_app
from pagedattn.server.engine_loop import AsyncEngine
from pagedattn.server.metrics import ServerMetrics
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.model_spec_wire import spec_from_wire, spec_to_wire
from tests.server.conftest import TINY_OPTIONS, serve_app

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnew lines",
    "unicode: café, 東京, emoji 🦙, combining é",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "",
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]


def _over_json(spec: ModelSpec) -> ModelSpec:
    """``spec`` through JSON text, as a replica would send it to the ingress."""
    return spec_from_wire(json.loads(json.dumps(spec_to_wire(spec))))


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> LLMEngine:
    return LLMEngine.from_config(engine_config(str(tiny_model_dir), **TINY_OPTIONS))


def _same_tokenizer(ours: Tokenizer, want: Tokenizer) -> None:
    for text in TEXTS:
        for special in (True, False):
            ids = want.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids
            assert ours.decode(ids) == want.decode(ids)
            assert ours.decode(ids, skip_special_tokens=True) == want.decode(
                ids, skip_special_tokens=True
            )
    assert ours.vocab_size == want.vocab_size
    assert ours.stop_token_ids == want.stop_token_ids
    assert ours.eos_token_id == want.eos_token_id
    assert ours.bos_token_id == want.bos_token_id
    assert ours.adds_bos == want.adds_bos
    assert ours.special_tokens == want.special_tokens
    assert ours.chat_template == want.chat_template
    if want.chat_template:
        assert ours.apply_chat_template(CONVERSATION) == want.apply_chat_template(CONVERSATION)
        assert ours.encode_chat(CONVERSATION) == want.encode_chat(CONVERSATION)


def test_a_gguf_tokenizer_survives_the_wire() -> None:
    """SmolLM2's byte-level BPE vocabulary, rebuilt from its GGUF metadata, then sent."""
    want = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(resolve_model(None))))
    spec = ModelSpec(
        tokenizer=want,
        vocab_size=want.vocab_size,
        logits_size=want.vocab_size,
        eos_token_ids=frozenset(want.stop_token_ids),
        max_model_len=2048,
        num_pages=100,
        cache=engine_config().cache,
        scheduler=engine_config().scheduler,
    )
    got = _over_json(spec)
    _same_tokenizer(got.tokenizer, want)
    assert got.tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]


def test_the_spec_of_an_engine_survives_the_wire_and_agrees_with_the_engine(
    tiny_engine: LLMEngine,
) -> None:
    engine = tiny_engine
    got = _over_json(ModelSpec.of_engine(engine))
    _same_tokenizer(got.tokenizer, engine.tokenizer)
    assert got.vocab_size == engine.vocab_size
    assert got.logits_size == engine.model_config.vocab_size
    assert got.eos_token_ids == engine.scheduler.eos_token_ids
    assert got.max_model_len == engine.scheduler.max_model_len == 512
    assert got.num_pages == engine.cache_manager.num_pages == 256
    assert got.page_size == engine.cache_manager.page_size == 4
    assert got.max_num_seqs == 64
    for prompt, max_tokens, copies in [(1, 1, 1), (5, 16, 1), (17, 100, 3), (400, 112, 8)]:
        want = engine.scheduler.max_pages_per_seq(prompt, max_tokens, copies)
        assert got.request_pages(prompt, max_tokens, copies) == want
    for prompt in ["Hello there", [1, 2, 3]]:
        assert got.encode(prompt) == engine.encode(prompt)
    for bad in ["", [], [engine.vocab_size]]:
        with pytest.raises(ValueError) as want_error:
            engine.encode(bad)
        with pytest.raises(ValueError) as got_error:
            got.encode(bad)
        assert str(got_error.value) == str(want_error.value)


@pytest.fixture(scope="module")
def wired_server(tiny_engine: LLMEngine) -> Iterator[str]:
    """A server whose handlers only know the spec that went through the wire."""
    spec = _over_json(ModelSpec.of_engine(tiny_engine))
    metrics = ServerMetrics(lambda: client.stats, "tiny")
    client = AsyncEngine(tiny_engine, metrics)
    app = create_client_app(client, spec, model_name="tiny", metrics=metrics)
    with serve_app(app) as srv:
        yield srv.url


def test_a_server_on_the_wired_spec_answers_as_the_engine_does(
    wired_server: str, tiny_engine: LLMEngine
) -> None:
    prompt = "The quick brown fox"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"{wired_server}/v1/completions", json=body, timeout=60).json()
    ids = tiny_engine.tokenizer.encode(prompt)
    assert reply["usage"]["prompt_tokens"] == len(ids)
    tokenized = httpx.post(f"{wired_server}/tokenize", json={"prompt": prompt}, timeout=10)
    assert tokenized.json()["tokens"] == ids
    # the chat prompt is the one the model's own template renders
    chat = {"model": "tiny", "messages": CONVERSATION, "max_tokens": 2, "temperature": 0}
    reply = httpx.post(f"{wired_server}/v1/chat/completions", json=chat, timeout=60).json()
    assert reply["usage"]["prompt_tokens"] == len(tiny_engine.tokenizer.encode_chat(CONVERSATION))
    models = httpx.get(f"{wired_server}/v1/models", timeout=10).json()
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 512)]


def test_the_wired_spec_refuses_what_the_engine_cannot_hold(wired_server: str) -> None:
    # 512-token context: a prompt of 500 ids and 100 completion tokens does not fit
    body = {"model": "tiny", "prompt": [5] * 500, "max_tokens": 100}
    reply = httpx.post(f"{wired_server}/v1/completions", json=body, timeout=10)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    # 65 sequences of one prompt: more than max_num_seqs (64) side by side
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "n": 65}
    reply = httpx.post(f"{wired_server}/v1/completions", json=body, timeout=10)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "n")
    # an id past the tokenizer's vocabulary (272 ids)
    body = {"model": "tiny", "prompt": [272], "max_tokens": 1}
    reply = httpx.post(f"{wired_server}/v1/completions", json=body, timeout=10)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "prompt")


def _broken(wire: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(wire)
    where = data
    for key in path[:-1]:
        where = where[key]
    if value is KeyError:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("version",), 2, "version"),
        (("vocab_size",), "272", "vocab_size"),
        (("vocab_size",), 0, "vocab_size"),
        (("vocab_size",), 300, "vocab_size"),  # disagrees with the tokenizer's 272 ids
        (("num_pages",), -1, "num_pages"),
        (("max_model_len",), 1.5, "max_model_len"),
        (("eos_token_ids",), [10**6], "eos_token_ids"),
        (("logits_size",), KeyError, "logits_size"),
        (("surprise",), 1, "surprise"),
        (("cache", "page_size"), 0, "cache"),
        (("cache", "no_such_field"), 1, "cache"),
        (("cache", "page_size"), [4], "cache.page_size"),
        (("scheduler", "max_num_seqs"), 0, "scheduler"),
        (("tokenizer", "backend_json"), "{not json", "tokenizer.backend_json"),
        (("tokenizer", "stop_token_ids"), ["2"], "tokenizer.stop_token_ids"),
        (("tokenizer", "stop_token_ids"), [272], "tokenizer.stop_token_ids"),
        (("tokenizer", "eos_token_id"), -1, "tokenizer.eos_token_id"),
        (("tokenizer", "special_tokens"), {"bos_token": 1}, "tokenizer.special_tokens"),
        (("tokenizer", "chat_template"), "{% if %}", "tokenizer"),
    ],
)
def test_malformed_wire_data_is_refused_naming_the_field(
    tiny_engine: LLMEngine, path: tuple[str, ...], value: Any, named: str
) -> None:
    wire = spec_to_wire(ModelSpec.of_engine(tiny_engine))
    with pytest.raises(ValueError, match=r"^model spec: ") as err:
        spec_from_wire(_broken(wire, path, value))
    assert named in str(err.value)


def test_the_wire_form_is_plain_json_values(tiny_engine: LLMEngine) -> None:
    wire = spec_to_wire(ModelSpec.of_engine(tiny_engine))

    def plain(value: Any) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, bool | int | float | str)

    assert plain(wire)
    spec = ModelSpec.of_engine(tiny_engine)
    got = spec_from_wire(json.loads(json.dumps(wire)))
    assert dataclasses.replace(got, tokenizer=None) == dataclasses.replace(spec, tokenizer=None)
